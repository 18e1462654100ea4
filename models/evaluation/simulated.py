"""End-to-end evaluation on the device simulator: what the on-call engineer sees.

A deterministic simulated fleet (homes and vehicles with rate-injected anomalies of every
kind, optionally transport faults) is generated on a virtual clock, with its ground truth.
Every device's messages go through :class:`streaming.engine.PartitionEngine` -- the exact
step of the Spark job -- in the order the simulator emitted them (the Kafka order of one
partition), with the virtual arrival time as the Kafka timestamp and ``now_ms``. The job's
processing-time silence timer is simulated: a device's messages are handed over in runs
separated by arrivals more than ``silence_timeout_s`` apart, and between two runs
``silence(..., last + timeout)`` is called, as the timer would have fired then (the
engine's results do not depend on how a stream is cut into batches).

The *raised* alerts are matched to the ground-truth windows of their device:

- an anomaly is **detected** when an alert of a rule that can plausibly report its kind
  (:data:`PLAUSIBLE_RULES`) is raised between its first affected reading and its last one
  plus ``grace_readings`` reading intervals; the delay is measured to the first such alert,
  in readings (``seq`` of the raising reading minus the window's first ``seq``; for
  ``device_silent``, elapsed time over the device's interval) and in seconds of event time;
- an alert that detects nothing but is raised inside a window (+ grace) of another kind,
  or in the *aftermath* of a window (up to the window's own duration, at most an hour,
  after it: a runaway room needs time to come back), is counted as ``related``: caused by
  an injected anomaly, neither a detection nor a false alarm;
- every other raised alert is a **false alarm**, attributed to its rule.

Per kind: recall, precision (detections of the kind over those plus the false alarms of
the kind's plausible rules on device types the kind applies to -- a rule shared by several
kinds charges its false alarms to each of them), F1, delays (median, p90) and the false
alarms per device-day of its rules. Per rule: alerts, true, related, false, false alarms
per device-day. A burn-in period at the start (detectors warming up on a fleet that was
switched on all at once) is left out of every count.

Deterministic: equal arguments give an equal report (wall-clock seconds aside).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from devices.anomaly_kinds import ANOMALY, KINDS, TRANSPORT
from devices.config import SimConfig
from devices.simulation import STATUS, Simulation
from iotwatch.contract.detection import RULES_FOR_ANOMALY_KIND
from iotwatch.settings import StreamSettings
from iotwatch.stats import quantile, rounded
from streaming import rules
from streaming.engine import PartitionEngine, RecordColumns
from streaming.state_store import MemoryStore

__all__ = [
    "GOALS",
    "PLAUSIBLE_RULES",
    "RECOMMENDED",
    "Alert",
    "SimulatedFleet",
    "check_goals",
    "compare",
    "evaluate_fleet",
    "evaluate_simulated",
    "match",
    "run_alerts",
    "settings_for",
    "simulate",
]

START_MS = 1_763_784_000_000  # 2025-11-22 04:00 UTC: a fixed, reproducible epoch
_DAY_MS = 86_400_000
_AFTERMATH_MAX_MS = 3_600_000

#: Which rules may report each anomaly kind (one table, shared with the demo's accounting).
PLAUSIBLE_RULES = RULES_FOR_ANOMALY_KIND

#: The issue's goals: recall at least, the rest at most (drift delay in seconds of event time).
GOALS: dict[str, float] = {
    "recall": 0.95,
    "false_alarms_per_device_day": 1.0,
    "median_delay_readings": 3,
    "drift_median_delay_s": 60.0,
}

#: The recommended stream settings (overrides of the defaults; the lead sets the defaults).
#: Tuned on a different seed (1; 10 homes, 4 vehicles, 1-2 days) than the reported one (7):
#: the stuck-HVAC rule fires on a 4 C gap held for 6 readings (normal operation never holds
#: more than 1 reading beyond 4 C), and a longer clear hold stops an alert from re-raising
#: on the same episode. Readings-based values assume the evaluated rates (home every 30 s,
#: so they are not the defaults, which must also suit 1 Hz devices).
RECOMMENDED: dict[str, Any] = {
    "alert_clear_readings": 30,
    "stuck_hvac_c": 4.0,
    "stuck_hvac_readings": 6,
}


# -- the fleet ---------------------------------------------------------------------------------


@dataclass
class DeviceStream:
    device_id: str
    device_type: str
    interval_ms: int
    messages: list[tuple[int, bytes]] = field(default_factory=list)  # (arrival ms, payload)


@dataclass
class SimulatedFleet:
    """A generated fleet: every device's messages in emission order, and the ground truth."""

    params: dict[str, Any]
    devices: dict[str, DeviceStream]
    truth: list[dict[str, Any]]
    start_ms: int
    end_ms: int

    @property
    def messages(self) -> int:
        return sum(len(d.messages) for d in self.devices.values())


def simulate(
    homes: int = 20,
    vehicles: int = 6,
    days: float = 2.0,
    seed: int = 7,
    *,
    home_interval_s: float = 30.0,
    vehicle_interval_s: float = 5.0,
    anomalies_per_day: float = 2.0,
    kinds: tuple[str, ...] | None = None,
    faults: bool = False,
    faults_per_day: float = 2.0,
    fault_kinds: tuple[str, ...] | None = None,
    mix: dict[str, int] | None = None,
    tick_ms: int = 5000,
) -> SimulatedFleet:
    """Generate the fleet on a virtual clock (no broker). ``anomalies_per_day`` is per device;
    ``kinds`` limits the anomaly kinds (default: all that apply to each device type),
    ``fault_kinds`` the transport faults (with ``faults``);
    ``mix`` fixes the devices per home by type (default: each home draws its own)."""
    params = {
        "homes": homes,
        "vehicles": vehicles,
        "days": days,
        "seed": seed,
        "home_interval_s": home_interval_s,
        "vehicle_interval_s": vehicle_interval_s,
        "anomalies_per_day": anomalies_per_day,
        "kinds": list(kinds) if kinds else None,
        "faults": faults,
        "faults_per_day": faults_per_day if faults else 0.0,
        "fault_kinds": list(fault_kinds) if fault_kinds else None,
        "mix": mix,
        "tick_ms": tick_ms,
    }
    config = SimConfig(
        seed=seed,
        homes=homes,
        vehicles=vehicles,
        rate=1.0 / home_interval_s,
        vehicle_hz=1.0 / vehicle_interval_s,
        start_ms=START_MS,
        anomaly_rate=anomalies_per_day / 24.0,
        anomaly_kinds=kinds,
        fault_rate=faults_per_day / 24.0 if faults else 0.0,
        fault_kinds=fault_kinds,
        mix=mix,
        tick_ms=tick_ms,
    )
    sim = Simulation(config)
    devices: dict[str, DeviceStream] = {}
    by_uid: dict[int, DeviceStream] = {}
    for group in sim.groups:
        for i, device_id in enumerate(group.device_ids):
            stream = DeviceStream(device_id, group.device_type, int(group.interval[i]))
            devices[device_id] = by_uid[int(group.uid[i])] = stream
    for batch in sim.run(days * 86400.0):
        arrival = sim.now_ms  # the end of the tick the messages were sent in
        for uid, _topic, payload, group_index in batch:
            if group_index == STATUS:
                continue
            data = payload if isinstance(payload, bytes) else payload.encode()
            by_uid[int(uid)].messages.append((arrival, data))
    end_ms = START_MS + int(days * _DAY_MS)
    return SimulatedFleet(params, dict(sorted(devices.items())), sim.injector.records, START_MS, end_ms)


# -- through the streaming job's per-device logic -----------------------------------------------


@dataclass(frozen=True)
class Alert:
    """One raised alert: when (event time of the raising reading, or the timer's virtual
    time for ``device_silent``) and at which ``seq``."""

    device_id: str
    rule: str
    raised_ms: int
    seq: int
    alert_id: str
    first_event_ms: int


def run_alerts(
    fleet: SimulatedFleet, settings: StreamSettings, on_row: Callable[[str, dict[str, Any]], None] | None = None
) -> list[Alert]:
    """Every device's messages through :class:`PartitionEngine`, with the silence timer; the raised alerts."""
    engine = PartitionEngine(settings)
    store = MemoryStore(engine.kernel.STATE_SIZE, engine.seq_words)
    timeout_ms = int(settings.silence_timeout_s * 1000)
    alerts: list[Alert] = []

    def collect(device_id: str, rows: Iterable[dict[str, Any]], timer_ms: int | None = None) -> None:
        for row in rows:
            if on_row is not None:
                on_row(device_id, row)
            if row["kind"] != "alert":
                continue
            body = json.loads(row["body"])
            if body["state"] != "raised":
                continue
            raised = timer_ms if timer_ms is not None else int(body["last_event_ms"])
            alerts.append(
                Alert(device_id, body["rule"], raised, int(body["seq"]), body["alert_id"], int(body["first_event_ms"]))
            )

    for device_id, stream in fleet.devices.items():
        arrivals = [arrival for arrival, _ in stream.messages]
        cuts = (
            [0] + [i for i in range(1, len(arrivals)) if arrivals[i] > arrivals[i - 1] + timeout_ms] + [len(arrivals)]
        )
        for start, end in zip(cuts, cuts[1:], strict=False):
            if start:
                timer = arrivals[start - 1] + timeout_ms
                collect(device_id, engine.silence(store, [device_id], timer).rows(), timer)
            run = stream.messages[start:end]
            records = RecordColumns.from_payloads(
                0,
                [payload for _, payload in run],
                [device_id] * len(run),
                list(range(start, end)),
                [arrival for arrival, _ in run],
                now_ms=run[-1][0],
            )
            collect(device_id, engine.process(store, records, run[-1][0]).rows())
        if arrivals and fleet.end_ms > arrivals[-1] + timeout_ms:
            timer = arrivals[-1] + timeout_ms
            collect(device_id, engine.silence(store, [device_id], timer).rows(), timer)
    return alerts


# -- matching ------------------------------------------------------------------------------------


def match(
    fleet: SimulatedFleet, alerts: list[Alert], *, grace_readings: int = 3, burn_in_s: float = 3 * 3600.0
) -> dict[str, Any]:
    """Match raised alerts to the ground truth; the per-kind and per-rule report."""
    begin = fleet.start_ms + int(burn_in_s * 1000)
    device_days = sum(max(fleet.end_ms - begin, 0) for _ in fleet.devices) / _DAY_MS
    types = {d.device_id: d.device_type for d in fleet.devices.values()}
    interval = {d.device_id: d.interval_ms for d in fleet.devices.values()}
    type_days: dict[str, float] = defaultdict(float)
    for device_type in types.values():
        type_days[device_type] += max(fleet.end_ms - begin, 0) / _DAY_MS

    windows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in fleet.truth:
        windows[record["device_id"]].append(record)
    by_device: dict[str, list[Alert]] = defaultdict(list)
    for alert in alerts:
        if alert.raised_ms >= begin:
            by_device[alert.device_id].append(alert)

    detections: dict[int, tuple[Alert, float, float]] = {}  # id(record) -> first detecting alert, delays
    verdict: dict[Alert, str] = {}
    for device_id, device_alerts in by_device.items():
        device_alerts.sort(key=lambda a: (a.raised_ms, a.seq, a.rule))
        step = interval[device_id]
        for alert in device_alerts:
            status = "false"
            for record in windows.get(device_id, ()):
                start, end = int(record["start_ts"]), int(record["end_ts"])
                inside = start <= alert.raised_ms <= end + grace_readings * step
                if inside and record["category"] == ANOMALY and alert.rule in PLAUSIBLE_RULES[record["kind"]]:
                    status = "true"
                    if id(record) not in detections:
                        if alert.rule == rules.SILENT:
                            delay_rows = (alert.raised_ms - start) / step
                        else:
                            delay_rows = float(alert.seq - int(record["start_seq"]))
                        detections[id(record)] = (alert, delay_rows, (alert.raised_ms - start) / 1000.0)
                elif status == "false":
                    after = min(max(end - start, grace_readings * step), _AFTERMATH_MAX_MS)
                    if inside or end < alert.raised_ms <= end + grace_readings * step + after:
                        status = "related"
            verdict[alert] = status

    kinds = sorted({r["kind"] for r in fleet.truth if r["category"] == ANOMALY} | set(PLAUSIBLE_RULES))
    scored = [r for r in fleet.truth if r["category"] == ANOMALY and int(r["start_ts"]) >= begin]
    false_by_rule_type: dict[tuple[str, str], int] = defaultdict(int)
    for alert, status in verdict.items():
        if status == "false":
            false_by_rule_type[(alert.rule, types[alert.device_id])] += 1

    per_kind: dict[str, Any] = {}
    for kind in kinds:
        records = [r for r in scored if r["kind"] == kind]
        if not records:
            continue
        applies = KINDS[kind].device_types
        kind_types = {t for t in type_days if applies is None or t in applies}
        hits = [detections[id(r)] for r in records if id(r) in detections]
        false = sum(
            n for (rule, t), n in false_by_rule_type.items() if rule in PLAUSIBLE_RULES[kind] and t in kind_types
        )
        recall = len(hits) / len(records)
        precision = len(hits) / (len(hits) + false) if hits or false else None
        f1 = 2 * precision * recall / (precision + recall) if precision is not None and precision + recall > 0 else None
        rows_d = [h[1] for h in hits]
        secs_d = [h[2] for h in hits]
        days = sum(type_days[t] for t in kind_types)
        per_kind[kind] = {
            "windows": len(records),
            "detected": len(hits),
            "recall": rounded(recall),
            "precision": rounded(precision),
            "f1": rounded(f1),
            "false_alarms": false,
            "false_alarms_per_device_day": rounded(false / days if days else None),
            "median_delay_readings": rounded(quantile(rows_d, 0.5), 2),
            "p90_delay_readings": rounded(quantile(rows_d, 0.9), 2),
            "median_delay_s": rounded(quantile(secs_d, 0.5), 1),
            "p90_delay_s": rounded(quantile(secs_d, 0.9), 1),
            "detected_by": dict(sorted(_count(h[0].rule for h in hits).items())),
            "median_window_readings": rounded(quantile([float(r["messages"]) for r in records], 0.5), 1),
        }

    per_rule: dict[str, Any] = {}
    for rule in sorted({a.rule for a in verdict}):
        mine = [s for a, s in verdict.items() if a.rule == rule]
        true, related, false = mine.count("true"), mine.count("related"), mine.count("false")
        by_type = {
            t: round(n / type_days[t], 4)
            for (r, t), n in sorted(false_by_rule_type.items())
            if r == rule and type_days[t]
        }
        per_rule[rule] = {
            "alerts": len(mine),
            "true": true,
            "related": related,
            "false": false,
            "precision": rounded(true / (true + false) if true + false else None),
            "false_alarms_per_device_day": rounded(false / device_days if device_days else None),
            "false_alarms_per_device_day_by_type": by_type,
        }

    total_false = sum(r["false"] for r in per_rule.values())
    total_true = sum(r["true"] for r in per_rule.values())
    hits_all = [detections[id(r)] for r in scored if id(r) in detections]
    recall = len(hits_all) / len(scored) if scored else None
    precision = total_true / (total_true + total_false) if total_true + total_false else None
    overall = {
        "windows": len(scored),
        "detected": len(hits_all),
        "recall": rounded(recall),
        "precision": rounded(precision),
        "f1": rounded(
            2 * precision * recall / (precision + recall)
            if precision is not None and recall is not None and precision + recall > 0
            else None
        ),
        "alerts": len(verdict),
        "false_alarms": total_false,
        "false_alarms_per_device_day": rounded(total_false / device_days if device_days else None),
        "median_delay_readings": rounded(quantile([h[1] for h in hits_all], 0.5), 2),
        "p90_delay_readings": rounded(quantile([h[1] for h in hits_all], 0.9), 2),
        "median_delay_s": rounded(quantile([h[2] for h in hits_all], 0.5), 1),
        "p90_delay_s": rounded(quantile([h[2] for h in hits_all], 0.9), 1),
        "device_days": rounded(device_days, 2),
    }
    transport = [r for r in fleet.truth if r["category"] == TRANSPORT]
    return {
        "overall": overall,
        "kinds": per_kind,
        "rules": per_rule,
        "transport_faults": dict(sorted(_count(r["kind"] for r in transport).items())),
    }


def _count(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for item in items:
        out[item] += 1
    return dict(out)


# -- settings and the whole evaluation -------------------------------------------------------------


def settings_for(overrides: dict[str, Any] | None = None) -> StreamSettings:
    """Stream settings for the evaluation: the defaults (environment and config file
    ignored, so the numbers do not depend on where they run) with ``overrides``. The fleet
    model is not used here: it needs a trained registry."""
    return StreamSettings.model_construct(**{**_defaults(), **(overrides or {})})


def _defaults() -> dict[str, Any]:
    return {
        name: (f.default_factory() if f.default_factory is not None else f.default)  # type: ignore[call-arg]
        for name, f in StreamSettings.model_fields.items()
    }


def evaluate_fleet(
    fleet: SimulatedFleet,
    overrides: dict[str, Any] | None = None,
    *,
    grace_readings: int = 3,
    burn_in_s: float = 3 * 3600.0,
) -> dict[str, Any]:
    """One configuration on one fleet: the matched report plus the settings used."""
    settings = settings_for(overrides)
    began = time.perf_counter()
    alerts = run_alerts(fleet, settings)
    report = match(fleet, alerts, grace_readings=grace_readings, burn_in_s=burn_in_s)
    used = {
        name: getattr(settings, name)
        for name in (
            "device_detector",
            "device_detector_params",
            "alert_fire_score",
            "alert_clear_score",
            "alert_hold_readings",
            "alert_clear_readings",
            "crash_decel_g",
            "harsh_braking_g",
            "stuck_hvac_c",
            "stuck_hvac_s",
            "stuck_hvac_readings",
            "allowed_lateness_s",
            "silence_timeout_s",
        )
    }
    return {
        "settings": used,
        "overrides": dict(overrides or {}),
        **report,
        "seconds": round(time.perf_counter() - began, 1),
    }


def compare(fleet: SimulatedFleet, configs: dict[str, dict[str, Any] | None], **kwargs: Any) -> dict[str, Any]:
    """Several named configurations on the same fleet."""
    return {name: evaluate_fleet(fleet, overrides, **kwargs) for name, overrides in configs.items()}


def check_goals(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each of :data:`GOALS` for one configuration's report: the measured value, the goal
    and whether it is met (a kind the fleet did not inject is ``None``, not met)."""
    overall, drift = run["overall"], run["kinds"].get("drift", {})
    measured = {
        "recall": overall["recall"],
        "false_alarms_per_device_day": overall["false_alarms_per_device_day"],
        "median_delay_readings": overall["median_delay_readings"],
        "drift_median_delay_s": drift.get("median_delay_s"),
    }
    out = {}
    for name, goal in GOALS.items():
        value = measured[name]
        met = value is not None and (value >= goal if name == "recall" else value <= goal)
        out[name] = {"value": value, "goal": goal, "met": met}
    return out


def evaluate_simulated(
    homes: int = 20,
    vehicles: int = 6,
    days: float = 2.0,
    seed: int = 7,
    *,
    configs: dict[str, dict[str, Any] | None] | None = None,
    grace_readings: int = 3,
    burn_in_s: float = 3 * 3600.0,
    **sim_kwargs: Any,
) -> dict[str, Any]:
    """Generate the fleet and evaluate the current defaults and the recommended settings."""
    began = time.perf_counter()
    fleet = simulate(homes, vehicles, days, seed, **sim_kwargs)
    generated = time.perf_counter() - began
    if configs is None:
        configs = {"defaults": None, "recommended": RECOMMENDED}
    results = compare(fleet, configs, grace_readings=grace_readings, burn_in_s=burn_in_s)
    for run in results.values():
        run["goals"] = check_goals(run)
    anomalies = [r for r in fleet.truth if r["category"] == ANOMALY]
    return {
        "simulation": {
            **fleet.params,
            "devices": len(fleet.devices),
            "messages": fleet.messages,
            "device_types": dict(sorted(_count(d.device_type for d in fleet.devices.values()).items())),
            "anomalies": dict(sorted(_count(r["kind"] for r in anomalies).items())),
            "grace_readings": grace_readings,
            "burn_in_s": burn_in_s,
            "seconds": round(generated, 1),
        },
        "goals": dict(GOALS),
        "configs": results,
    }
