"""The simulation loop, without any broker: ticks of virtual time in, messages out (docs/internals.md,
"Simulation loop")."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

import numpy as np

from iotwatch.contract.device_commands import TwinProperties
from iotwatch.contract.ground_truth import OPERATOR, SETPOINT_CHANGE, Injection
from iotwatch.contract.telemetry import GOODBYE_EVENT
from iotwatch.devices import seq_state
from iotwatch.devices.anomaly_kinds import TRANSPORT
from iotwatch.devices.config import SimConfig
from iotwatch.devices.faults import corrupt
from iotwatch.devices.fleet import build_fleet
from iotwatch.devices.group import DeviceGroup
from iotwatch.devices.home.thermostat import ThermostatGroup
from iotwatch.devices.injector import DRAWS, STATUS, Injector
from iotwatch.devices.rng import CounterRng
from iotwatch.devices.twin import DeviceTwins

__all__ = ["Outgoing", "STATUS", "Simulation"]

Outgoing = tuple[int, str, Any, int]


class Simulation:
    def __init__(self, config: SimConfig, shard: int = 0, shards: int = 1, *, count_limit: int | None = None) -> None:
        self.config = config
        self.rng = CounterRng(config.seed)
        self.fleet = build_fleet(config, shard, shards)
        self.groups: list[DeviceGroup] = self.fleet.groups
        #: devices whose seq carries on from the state file (the others start at 0)
        self.carried_on = self._carry_on(config)
        self._first_seq = [group.seq.copy() for group in self.groups]
        self.type_names = [g.device_type for g in self.groups]
        self.injector = Injector(config, self.groups, self.rng)
        self.now_ms = config.start_ms
        self.tick_ms = config.tick_ms
        self.readings = 0  # generated; messages sent = readings - withheld + extra_copies (+ those delayed)
        self.withheld = 0  # readings an injected dropout kept from being sent
        self.extra_copies = 0  # copies sent by duplicate faults, beyond the original
        self.remaining = count_limit
        self.events: dict[str, int] = {}
        self._delayed: list[tuple[int, int, Outgoing]] = []
        self._order = 0
        self._where = {
            device_id: (gi, i) for gi, g in enumerate(self.groups) for i, device_id in enumerate(g.device_ids)
        }
        self._extra: list[Outgoing] = []  # messages an obeyed command caused, sent with the next tick
        self.twins = DeviceTwins()

    def _carry_on(self, config: SimConfig) -> int:
        if config.seq_state is None:
            return 0
        known = seq_state.load(config.seq_state)
        found = 0
        for group in self.groups:
            for i, device_id in enumerate(group.device_ids):
                if device_id in known:
                    group.seq[i] = known[device_id][0]
                    found += 1
        return found

    def seq_end(self) -> seq_state.DeviceSeq:
        """Next seq and last event time of every device that published in this run."""
        out: seq_state.DeviceSeq = {}
        for group, first in zip(self.groups, self._first_seq, strict=True):
            for i in np.flatnonzero(group.seq > first).tolist():
                out[group.device_ids[i]] = (int(group.seq[i]), int(group.next_due[i] - group.interval[i]))
        return out

    @property
    def devices(self) -> int:
        return sum(g.size for g in self.groups)

    @property
    def exhausted(self) -> bool:
        """The count limit is reached, or every device is a replayed stream that ended."""
        if self.remaining is not None and self.remaining <= 0:
            return True
        finite = [g for g in self.groups if hasattr(g, "finished")]
        return bool(finite) and len(finite) == len(self.groups) and all(g.finished() for g in finite)

    def tick(self) -> list[Outgoing]:
        """Generate everything due in [now, now + tick) and advance the clock."""
        end = self.now_ms + self.tick_ms
        out: list[Outgoing] = self._extra
        self._extra = []
        for gi, group in enumerate(self.groups):
            while True:
                idx = group.due(end)
                if not len(idx):
                    break
                if self.remaining is not None:
                    if self.remaining <= 0:
                        break
                    idx = idx[: self.remaining]
                    self.remaining -= len(idx)
                self._batch(gi, group, idx, out)
        delayed = self._delayed
        while delayed and delayed[0][0] < end:
            out.append(heapq.heappop(delayed)[2])
        self.now_ms = end
        if not out and self.groups:  # idle: skip empty ticks (on the same tick grid)
            upcoming = min([g.next_due_min() for g in self.groups] + ([delayed[0][0]] if delayed else []))
            if upcoming > end:
                start = self.config.start_ms
                self.now_ms = max(end, start + (upcoming - start) // self.tick_ms * self.tick_ms)
        return out

    def obey(self, device_id: str, command: str, command_id: str, args: dict[str, Any] | None = None) -> str | None:
        """Carry out ``command`` on a simulated device (:mod:`iotwatch.devices.twin`): a corrective command
        ends the physical anomaly it fixes, and the ground truth names the command. None when
        done, else why the device cannot do it."""
        where = self._where.get(device_id)
        if where is None:
            return f"unknown device {device_id}"
        gi, i = where

        def end(kind: str, by: str) -> None:
            self.injector.end_by_command(gi, i, kind, self.now_ms, by, self._extra)

        group = self.groups[gi]
        before = float(group.setpoint[i]) if isinstance(group, ThermostatGroup) else None
        refused = self.twins.obey(group, i, command, args or {}, end, command_id)
        if refused is None and isinstance(group, ThermostatGroup) and before != float(group.setpoint[i]):
            self.injector.records.append(self._setpoint_change(group, i, before, command_id))
        return refused

    def _setpoint_change(self, group: ThermostatGroup, i: int, before: float | None, command_id: str) -> Injection:
        """The ground truth of an operator's setpoint change: expected, not an anomaly, from now
        until the room can have reached the new setpoint at the HVAC's power (the settling)."""
        after = float(group.setpoint[i])
        power_c_per_h = float(group.homes.hvac_power_c_per_h[group.home[i]])
        settle_ms = int(abs(after - (before if before is not None else after)) / power_c_per_h * 3_600_000)
        interval = int(group.interval[i])
        seq = int(group.seq[i])
        readings = max(1, settle_ms // max(interval, 1))
        return Injection(
            device_id=group.device_ids[i],
            device_type=group.device_type,
            site=group.sites[i],
            kind=SETPOINT_CHANGE,
            category=OPERATOR,
            start_ts=self.now_ms,
            end_ts=self.now_ms + settle_ms,
            start_seq=seq,
            end_seq=seq + readings - 1,
            messages=readings,
            source="command",
            params={"from_c": before, "to_c": after, "command_id": command_id},
        )

    def reported(self, device_id: str) -> TwinProperties | None:
        """The twin properties the device reports (None: not simulated here)."""
        where = self._where.get(device_id)
        return None if where is None else self.twins.reported(self.groups[where[0]], where[1])

    def goodbye(self) -> list[Outgoing]:
        """Every device's last reading, due now, carrying the goodbye event
        (:data:`iotwatch.contract.telemetry.GOODBYE_EVENT`): the devices stop cleanly, and the
        job marks them offline instead of silent."""
        out: list[Outgoing] = []
        for gi, group in enumerate(self.groups):
            idx = np.arange(group.size)
            if not len(idx):
                continue
            seq = group.seq[idx].copy()
            t = np.maximum(group.next_due[idx] - group.interval[idx], self.now_ms)
            u = self.rng.uniform(group.uid[idx], seq, 0, group.draws + DRAWS)
            values, _events = group.step(idx, t, seq, u[:, : group.draws])
            uids = group.uid[idx].tolist()
            for r, i in enumerate(idx.tolist()):
                payload = group.event_payload(i, int(seq[r]), int(t[r]), values[r], GOODBYE_EVENT, None)
                out.append((uids[r], group.topics[i], payload, gi))
            group.advance(idx)
            self.readings += len(idx)
            self.events[GOODBYE_EVENT] = self.events.get(GOODBYE_EVENT, 0) + len(idx)
        return out

    def finish(self) -> list[Outgoing]:
        """Deliver what is still held back (late, out of order) and close open anomalies."""
        out = [item[2] for item in sorted(self._delayed)]
        self._delayed.clear()
        self.injector.close_all(self.now_ms, out)
        return out

    def run(self, duration_s: float) -> Iterator[list[Outgoing]]:
        """Ticks until ``duration_s`` of virtual time (or the count limit) is done."""
        stop = self.config.start_ms + int(duration_s * 1000)
        while self.now_ms < stop and not self.exhausted:
            yield self.tick()
        yield self.finish()

    # -- one batch of one device type ------------------------------------------------------

    def _batch(self, gi: int, group: DeviceGroup, idx: np.ndarray, out: list[Outgoing]) -> None:
        t = group.next_due[idx]
        seq = group.seq[idx]
        self.readings += len(idx)
        injector = self.injector
        u = self.rng.uniform(group.uid[idx], seq, 0, group.draws + DRAWS)
        injector.begin(gi, group, idx, t, seq, u[:, group.draws :], out)
        values, events = group.step(idx, t, seq, u[:, : group.draws])
        effects = injector.apply(gi, group, idx, t, seq, values)
        events += group.finalize(idx, t, seq, values)
        ts = t
        if effects is not None and effects.ts_shift:
            ts = t.copy()
            for r, shift in effects.ts_shift.items():
                ts[r] += shift
        payloads: list[Any] = group.payloads(idx, seq, ts, values)
        for r, name, data in events:
            payloads[r] = group.event_payload(int(idx[r]), int(seq[r]), int(ts[r]), values[r], name, data)
            self.events[name] = self.events.get(name, 0) + 1
        uids = group.uid[idx].tolist()
        topics = group.topics
        if effects is None or not (effects.suppress or effects.transport):
            out.extend(zip(uids, [topics[i] for i in idx.tolist()], payloads, [gi] * len(payloads), strict=True))
        else:
            for r, (uid, i, payload) in enumerate(zip(uids, idx.tolist(), payloads, strict=True)):
                if r in effects.suppress:
                    self.withheld += 1
                    continue
                message = (uid, topics[i], payload, gi)
                actives = effects.transport.get(r)
                if not actives:
                    out.append(message)
                    continue
                copies, delay_ms = 1, 0
                for active in actives:
                    params = active.params
                    if active.kind.name == "malformed":
                        message = (uid, topics[i], corrupt(payload, params["variant"]), gi)
                    elif active.kind.name == "duplicate":
                        copies += int(params["copies"])
                        self.extra_copies += int(params["copies"])
                    elif active.kind.name == "out_of_order":
                        delay_ms = max(delay_ms, int((params["depth"] + 0.5) * group.interval[i]))
                    elif active.kind.name == "late" and active.kind.category == TRANSPORT:
                        delay_ms = max(delay_ms, int(params["delay_s"] * 1000))
                for _ in range(copies):
                    if delay_ms:
                        self._order += 1
                        heapq.heappush(self._delayed, (int(t[r]) + delay_ms, self._order, message))
                    else:
                        out.append(message)
        group.advance(idx)
