"""Starts, applies and ends anomalies and transport faults, and records the ground truth
(docs/internals.md, "Injector")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from iotwatch.contract.device_topics import DeviceStatus, status_payload
from iotwatch.contract.ground_truth import Injection, InjectionSource
from iotwatch.contract.metric_catalog import DEVICE_METRICS
from iotwatch.devices.anomaly_kinds import (
    ANOMALY,
    TRANSPORT,
    Kind,
    apply_measurement,
    draw_params,
    kinds_for,
    resolve_kind,
)
from iotwatch.devices.config import SimConfig
from iotwatch.devices.group import DeviceGroup
from iotwatch.devices.rng import CounterRng
from iotwatch.devices.scenario import load_scenario
from iotwatch.devices.vehicle import VehicleGroup

__all__ = ["Active", "Effects", "Injector", "STATUS"]

STATUS = -1  # group index of status messages in an outgoing tuple
#: columns of the batch's injector uniforms: (start?, which kind) per category
_START_COLUMNS = {ANOMALY: 0, TRANSPORT: 2}
DRAWS = 4
_PARAM_STREAM = 7200
_NOISE_STREAM = 7300
_PICK_STREAM = 7400
#: a vehicle must be moving this fast (m/s) for a crash or harsh braking to start
_MIN_SPEED = {"crash": 20.0 / 3.6, "harsh_braking": 30.0 / 3.6}
#: readings of a device between the end of a rate-drawn anomaly and the end of a bounded run
_READINGS_AFTER = 5


@dataclass
class Active:
    kind: Kind
    gi: int
    i: int
    start_ms: int
    end_ms: int
    params: dict[str, Any]
    source: InjectionSource
    first_ts: int = -1
    last_ts: int = -1
    first_seq: int = -1
    last_seq: int = -1
    messages: int = 0
    state: dict[str, Any] = field(default_factory=dict)


@dataclass
class Effects:
    """What active anomalies do to one batch's messages."""

    suppress: set[int] = field(default_factory=set)
    ts_shift: dict[int, int] = field(default_factory=dict)
    transport: dict[int, list[Active]] = field(default_factory=dict)


class Injector:
    def __init__(self, config: SimConfig, groups: list[DeviceGroup], rng: CounterRng) -> None:
        self.groups = groups
        self.rng = rng
        self.active: dict[tuple[int, int], list[Active]] = {}
        self.flags = [np.zeros(g.size, dtype=bool) for g in groups]
        self.n_active = [0] * len(groups)
        self.records: list[Injection] = []
        self.started: dict[str, int] = {}
        self.rates = {ANOMALY: config.anomaly_rate / 3600.0, TRANSPORT: config.fault_rate / 3600.0}
        #: event time before which no rate-drawn anomaly starts (transport faults may)
        self.not_before = {ANOMALY: config.start_ms + int(round(config.anomalies_after_s * 1000)), TRANSPORT: 0}
        #: event time by which a rate-drawn anomaly or fault must be over, when the run's length
        #: is known: its ground truth then describes a whole one, not one cut by the end
        self.run_end_ms = None if config.duration_s is None else config.start_ms + int(round(config.duration_s * 1000))
        self.rate_kinds = [
            {
                ANOMALY: kinds_for(g.device_type, ANOMALY, config.anomaly_kinds),
                TRANSPORT: kinds_for(g.device_type, TRANSPORT, config.fault_kinds),
            }
            for g in groups
        ]
        for names in (config.anomaly_kinds, config.fault_kinds):
            for name in names or ():
                resolve_kind(name)  # unknown names fail early
        self.pending: list[list[tuple[int, int, Kind, float | None, dict[str, Any]]]] = [[] for _ in groups]
        if config.scenario is not None:
            self._plan(config, load_scenario(config.scenario))

    def _plan(self, config: SimConfig, scenario: Any) -> None:
        for n, entry in enumerate(scenario.anomalies):
            kind = resolve_kind(entry.kind)
            start = config.start_ms + int(entry.at_s * 1000)
            for gi, group in enumerate(self.groups):
                if kind.device_types is not None and group.device_type not in kind.device_types:
                    continue
                for i, device_id in enumerate(group.device_ids):
                    if not entry.matches(device_id, group.device_type):
                        continue
                    if (
                        entry.fraction < 1.0
                        and self.rng.scalar_uniform(int(group.uid[i]), n, _PICK_STREAM) >= entry.fraction
                    ):
                        continue
                    self.pending[gi].append((start, i, kind, entry.duration_s, entry.params()))
        for pending in self.pending:
            pending.sort(key=lambda item: (item[0], item[1]))

    # -- per batch --------------------------------------------------------------------

    def begin(
        self,
        gi: int,
        group: DeviceGroup,
        idx: np.ndarray,
        t: np.ndarray,
        seq: np.ndarray,
        u_all: np.ndarray,
        out: list[tuple[int, str, Any, int]],
    ) -> None:
        """End what is over and start what is due, before the devices step."""
        if self.n_active[gi]:
            for r in np.flatnonzero(self.flags[gi][idx]).tolist():
                i = int(idx[r])
                for active in list(self.active[(gi, i)]):
                    if t[r] > active.end_ms:
                        self._close(active, int(t[r]), out)
        pending = self.pending[gi]
        if pending and pending[0][0] <= int(t.max()):
            keep = []
            tmax = int(t.max())
            for item in pending:
                start, i, kind, duration_s, params = item
                pos = int(np.searchsorted(idx, i))
                if (
                    start <= tmax
                    and pos < len(idx)
                    and idx[pos] == i
                    and t[pos] >= start
                    and self._may_start(group, i, kind)
                ):
                    self._open(
                        gi, group, i, kind, start, int(t[pos]), int(seq[pos]), duration_s, params, "scenario", out
                    )
                else:
                    keep.append(item)
            self.pending[gi] = keep
        for category, rate in self.rates.items():
            kinds = self.rate_kinds[gi][category]
            if rate <= 0.0 or not kinds:
                continue
            col = _START_COLUMNS[category]
            u = u_all[:, col : col + 2]
            chance = rate * group.interval[idx] * 1e-3
            for r in np.flatnonzero((u[:, 0] < chance) & (t >= self.not_before[category])).tolist():
                i = int(idx[r])
                if any(a.kind.category == category for a in self.active.get((gi, i), ())):
                    continue
                kind = kinds[int(u[r, 1] * len(kinds))]
                if self._may_start(group, i, kind) and self._fits(group, i, kind, int(t[r])):
                    self._open(gi, group, i, kind, int(t[r]), int(t[r]), int(seq[r]), None, {}, "rate", out)

    def _latest_end(self, group: DeviceGroup, i: int) -> int | None:
        """When a rate-drawn anomaly or fault must end: a few readings before the run does, so that
        the readings after it show it is over."""
        if self.run_end_ms is None:
            return None
        return self.run_end_ms - int(_READINGS_AFTER * float(group.interval[i]))

    def _fits(self, group: DeviceGroup, i: int, kind: Kind, t: int) -> bool:
        latest = self._latest_end(group, i)
        return latest is None or t + int(kind.duration_s[0] * 1000) <= latest

    @staticmethod
    def _may_start(group: DeviceGroup, i: int, kind: Kind) -> bool:
        minimum = _MIN_SPEED.get(kind.name)
        return minimum is None or (isinstance(group, VehicleGroup) and float(group.speed[i]) > minimum)

    def apply(
        self, gi: int, group: DeviceGroup, idx: np.ndarray, t: np.ndarray, seq: np.ndarray, values: np.ndarray
    ) -> Effects | None:
        """Change this batch's readings; say which messages to drop, re-time or alter."""
        if not self.n_active[gi]:
            return None
        effects = Effects()
        ranges = DEVICE_METRICS.get(group.device_type, {})
        for r in np.flatnonzero(self.flags[gi][idx]).tolist():
            i = int(idx[r])
            ts, sq = int(t[r]), int(seq[r])
            for active in self.active[(gi, i)]:
                kind = active.kind
                if active.messages == 0:
                    active.first_ts, active.first_seq = ts, sq
                active.last_ts, active.last_seq = ts, sq
                active.messages += 1
                if kind.measurement:
                    metric = active.params["metric"]
                    j = group.metric_index[metric]
                    noise = 0.0
                    if kind.name == "noise_burst":
                        noise = float(self.rng.normal(group.uid[i : i + 1], seq[r : r + 1], _NOISE_STREAM)[0, 0])
                    value = apply_measurement(
                        kind.name,
                        active.params,
                        float(values[r, j]),
                        ts - active.start_ms,
                        active.end_ms - active.start_ms,
                        active.state,
                        noise,
                    )
                    if kind.name != "out_of_range" and metric in ranges:
                        _, low, high = ranges[metric]
                        value = min(max(value, low), high)
                    values[r, j] = value
                elif kind.name == "dropout":
                    effects.suppress.add(r)
                elif kind.name == "clock_skew":
                    effects.ts_shift[r] = int(round(active.params["skew_s"] * 1000))
                elif kind.category == TRANSPORT:
                    effects.transport.setdefault(r, []).append(active)
        return effects

    # -- start / end --------------------------------------------------------------------

    def _open(
        self,
        gi: int,
        group: DeviceGroup,
        i: int,
        kind: Kind,
        planned: int,
        t: int,
        seq: int,
        duration_s: float | None,
        given: dict[str, Any],
        source: InjectionSource,
        out: list[tuple[int, str, Any, int]],
    ) -> None:
        uid = group.uid[i : i + 1]
        u = self.rng.uniform(uid, np.array([seq], dtype=np.int64), _PARAM_STREAM, 4)[0]
        params = draw_params(kind, group.device_type, group.metrics, u, given)
        if duration_s is None:
            low, high = kind.duration_s
            duration_s = low + (high - low) * float(u[0])
        end = max(planned + int(round(duration_s * 1000)), t)
        latest = self._latest_end(group, i) if source == "rate" else None
        if latest is not None:
            end = max(min(end, latest), t)
        active = Active(kind, gi, i, planned, end, params, source)
        self.active.setdefault((gi, i), []).append(active)
        self.flags[gi][i] = True
        self.n_active[gi] += 1
        self.started[kind.name] = self.started.get(kind.name, 0) + 1
        if kind.mode:
            group.mode[i] = kind.mode
            group.mode_since[i] = t
        if kind.name == "dropout":
            out.append((int(group.uid[i]), group.status_topics[i], status_payload(DeviceStatus.LOST, t), STATUS))

    def end_by_command(
        self, gi: int, i: int, kind: str, t: int, command_id: str, out: list[tuple[int, str, Any, int]]
    ) -> int:
        """End the device's active ``kind`` anomalies because a command fixed them (the ground
        truth says which command); returns how many ended."""
        ended = [a for a in self.active.get((gi, i), ()) if a.kind.name == kind]
        for active in ended:
            self._close(active, t, out, ended_by=command_id)
        return len(ended)

    def _close(self, active: Active, t: int, out: list[tuple[int, str, Any, int]], ended_by: str | None = None) -> None:
        group = self.groups[active.gi]
        key = (active.gi, active.i)
        self.active[key].remove(active)
        if not self.active[key]:
            del self.active[key]
            self.flags[active.gi][active.i] = False
        self.n_active[active.gi] -= 1
        if active.kind.mode and not any(a.kind.mode for a in self.active.get(key, ())):
            group.mode[active.i] = 0
        if active.kind.name == "dropout":
            out.append(
                (
                    int(group.uid[active.i]),
                    group.status_topics[active.i],
                    status_payload(DeviceStatus.ONLINE, t),
                    STATUS,
                )
            )
        if active.messages:
            self.records.append(
                Injection(
                    device_id=group.device_ids[active.i],
                    device_type=group.device_type,
                    site=group.sites[active.i],
                    kind=active.kind.name,
                    category=active.kind.category,
                    start_ts=active.first_ts,
                    end_ts=active.last_ts,
                    start_seq=active.first_seq,
                    end_seq=active.last_seq,
                    messages=active.messages,
                    source=active.source,
                    params=active.params,
                    ended_by_command=ended_by,
                )
            )

    def close_all(self, t: int, out: list[tuple[int, str, Any, int]]) -> None:
        for actives in list(self.active.values()):
            for active in list(actives):
                self._close(active, t, out)
