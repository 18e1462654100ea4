"""The one evaluator of alerts against the ground truth: ``iotwatch evaluate --simulated``,
the demo's report and the tests all judge by :func:`judge`, so a verdict means the same
everywhere. Alerts are placed on injections by seq, which a clock-skew fault cannot move;
each is a detection, related, the end of the run, or a false alarm (docs/detection.md,
"The simulated fleet", defines them and the figures).

>>> truth = [Injection(device_id="t1", device_type="thermostat", site="h", kind="spike",
...                    category="anomaly", start_ts=10_000, end_ts=10_000, start_seq=10,
...                    end_seq=10, messages=1, source="rate")]
>>> alerts = [RaisedAlert("a", "t1", "anomaly_score", seq=10, raised_ms=10_000),
...           RaisedAlert("b", "t1", "anomaly_score", seq=40, raised_ms=40_000)]
>>> run = JudgedRun(device_types={"t1": "thermostat"}, intervals_ms={"t1": 1000})
>>> result = judge(truth, alerts, run)
>>> result.verdicts
{'a': 'true', 'b': 'false'}
>>> result.report["overall"]["recall"], result.report["overall"]["precision"]
(1.0, 0.5)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.detection import RULES_FOR_ANOMALY_KIND, AnomalyKind, Rule
from iotwatch.contract.ground_truth import ANOMALY, OPERATOR, TRANSPORT, Injection
from iotwatch.devices.anomaly_kinds import KINDS
from iotwatch.stats import quantile, rounded

__all__ = ["END_OF_RUN", "FALSE_ALARM", "RELATED", "TRUE", "JudgedRun", "Judgement", "RaisedAlert", "judge"]

#: An alert's verdict.
TRUE, RELATED, FALSE_ALARM, END_OF_RUN = "true", "related", "false", "end_of_run"

_DAY_MS = 86_400_000
_AFTERMATH_MAX_MS = 3_600_000


@dataclass(frozen=True)
class RaisedAlert:
    """What the judgement needs of one raised alert."""

    alert_id: str
    device_id: str
    rule: str
    #: the reading that raised it (``device_silent``: the newest reading before the silence)
    seq: int
    #: event time of that reading; ``device_silent``: when the silence was noticed
    raised_ms: int

    @classmethod
    def of_record(cls, record: AlertRecord, original: AlertRecord | None = None) -> RaisedAlert:
        """A raised record of the alert topic. A silence is noticed in processing time
        (``detected_at_ms``); every other rule raises on a reading's event time. A record
        raised on no reading of its own (the responder's escalation) is placed at its
        ``original`` alert's reading; without one, before every reading (seq -1)."""
        placed = original if record.seq is None and original is not None else record
        silent = record.rule == Rule.DEVICE_SILENT
        raised_ms = record.detected_at_ms if silent or placed.last_event_ms is None else placed.last_event_ms
        seq = placed.seq if placed.seq is not None else placed.start_seq
        return cls(record.alert_id, record.device_id, record.rule, int(seq if seq is not None else -1), raised_ms)


@dataclass(frozen=True)
class JudgedRun:
    """The run the alerts came from."""

    #: device -> its type, for every device of the run
    device_types: Mapping[str, str]
    #: device -> its reporting interval (ms): grace and delays are counted in readings
    intervals_ms: Mapping[str, int]
    #: the run's event-time span (ms), for the burn-in and false alarms per device-day;
    #: None when unknown (no burn-in, no per-device-day figures)
    start_ms: int | None = None
    end_ms: int | None = None
    #: device -> its newest seq of the run, to tell the end of the run from a silence;
    #: None: the run did not stop its devices (no end-of-run verdicts)
    last_seq: Mapping[str, int] | None = None


@dataclass
class Judgement:
    """The report (overall, per kind, per rule, transport faults) and each raised alert's verdict."""

    report: dict[str, Any]
    verdicts: dict[str, str] = field(default_factory=dict)


def judge(
    truth: Iterable[Injection],
    alerts: Iterable[RaisedAlert],
    run: JudgedRun,
    *,
    grace_readings: int = 3,
    burn_in_s: float = 0.0,
) -> Judgement:
    """Judge the raised ``alerts`` of ``run`` against its ground truth (see the module)."""
    truth = list(truth)
    begin = None if run.start_ms is None else run.start_ms + int(burn_in_s * 1000)
    span_days = None if begin is None or run.end_ms is None else max(run.end_ms - begin, 0) / _DAY_MS
    type_days: dict[str, float] = defaultdict(float)
    for device_type in run.device_types.values():
        type_days[device_type] += span_days or 0.0
    device_days = span_days * len(run.device_types) if span_days is not None else None

    injections: dict[str, list[Injection]] = defaultdict(list)
    for event in truth:
        injections[event.device_id].append(event)
    by_device: dict[str, list[RaisedAlert]] = defaultdict(list)
    for alert in alerts:
        if begin is None or alert.raised_ms >= begin:
            by_device[alert.device_id].append(alert)

    detections: dict[int, tuple[RaisedAlert, float, float]] = {}  # id(injection) -> first detection, delays
    verdicts: dict[str, str] = {}
    judged: list[tuple[RaisedAlert, str]] = []
    ends = run.last_seq
    for device_id, device_alerts in by_device.items():
        device_alerts.sort(key=lambda a: (a.raised_ms, a.seq, a.rule))
        step = max(run.intervals_ms.get(device_id, 1000), 1)
        for alert in device_alerts:
            status = FALSE_ALARM
            for event in injections.get(device_id, ()):
                dropout = event.kind == AnomalyKind.DROPOUT
                low = event.start_seq - (1 if dropout else 0)
                inside = low <= alert.seq <= event.end_seq + grace_readings
                if inside and event.category == ANOMALY and alert.rule in _rules_for(event.kind):
                    status = TRUE
                    if id(event) not in detections:
                        if alert.rule == Rule.DEVICE_SILENT:
                            delay_readings = (alert.raised_ms - event.start_ts) / step
                        else:
                            delay_readings = float(alert.seq - event.start_seq)
                        detections[id(event)] = (alert, delay_readings, (alert.raised_ms - event.start_ts) / 1000.0)
                elif status == FALSE_ALARM and event.category != OPERATOR:
                    after = min(max(event.end_seq - event.start_seq, grace_readings), _AFTERMATH_MAX_MS // step)
                    if inside or event.end_seq < alert.seq <= event.end_seq + grace_readings + after:
                        status = RELATED
            if (
                status == FALSE_ALARM
                and ends is not None
                and alert.rule == Rule.DEVICE_SILENT
                and alert.seq >= ends.get(device_id, 1 << 62)
            ):
                status = END_OF_RUN
            verdicts[alert.alert_id] = status
            judged.append((alert, status))

    anomalies = [e for e in truth if e.category == ANOMALY]
    scored = [e for e in anomalies if begin is None or e.start_ts >= begin]
    false_by_rule_type: dict[tuple[str, str], int] = defaultdict(int)
    for alert, status in judged:
        if status == FALSE_ALARM:
            false_by_rule_type[(alert.rule, run.device_types.get(alert.device_id, "unknown"))] += 1

    per_kind: dict[str, Any] = {}
    for kind in sorted({e.kind for e in anomalies} | set(RULES_FOR_ANOMALY_KIND)):
        events = [e for e in scored if e.kind == kind]
        if not events:
            continue
        applies = KINDS[kind].device_types if kind in KINDS else None
        kind_types = {t for t in type_days if applies is None or t in applies}
        hits = [detections[id(e)] for e in events if id(e) in detections]
        plausible = _rules_for(kind)
        false = sum(n for (rule, t), n in false_by_rule_type.items() if rule in plausible and t in kind_types)
        days = sum(type_days[t] for t in kind_types)
        per_kind[kind] = {
            "windows": len(events),
            "detected": len(hits),
            **_scores(len(hits), len(events), false),
            "false_alarms": false,
            "false_alarms_per_device_day": rounded(false / days if days else None),
            **_delays(hits),
            "detected_by": count_names(h[0].rule for h in hits),
            "median_window_readings": rounded(quantile([float(e.messages) for e in events], 0.5), 1),
        }

    per_rule: dict[str, Any] = {}
    for rule in sorted({a.rule for a, _ in judged}):
        mine = [status for a, status in judged if a.rule == rule]
        true, related, false = mine.count(TRUE), mine.count(RELATED), mine.count(FALSE_ALARM)
        per_rule[rule] = {
            "alerts": len(mine),
            "true": true,
            "related": related,
            "false": false,
            "end_of_run": mine.count(END_OF_RUN),
            "precision": rounded(true / (true + false) if true + false else None),
            "false_alarms_per_device_day": rounded(false / device_days if device_days else None),
            "false_alarms_per_device_day_by_type": {
                t: round(n / type_days[t], 4)
                for (r, t), n in sorted(false_by_rule_type.items())
                if r == rule and type_days.get(t)
            },
        }

    statuses = [status for _, status in judged]
    total_true, total_false = statuses.count(TRUE), statuses.count(FALSE_ALARM)
    hits_all = [detections[id(e)] for e in scored if id(e) in detections]
    overall = {
        "windows": len(scored),
        "detected": len(hits_all),
        **_scores(len(hits_all), len(scored), total_false, true_alerts=total_true),
        "alerts": len(judged),
        "true": total_true,
        "related": statuses.count(RELATED),
        "end_of_run": statuses.count(END_OF_RUN),
        "false_alarms": total_false,
        "false_alarms_by_rule": count_names(a.rule for a, status in judged if status == FALSE_ALARM),
        "false_alarms_per_device_day": rounded(total_false / device_days if device_days else None),
        **_delays(hits_all),
        "device_days": rounded(device_days, 2),
    }
    report = {
        "overall": overall,
        "kinds": per_kind,
        "rules": per_rule,
        "transport_faults": count_names(e.kind for e in truth if e.category == TRANSPORT),
        "operator_actions": _operator_actions(truth, by_device, verdicts),
    }
    return Judgement(report, verdicts)


def _operator_actions(
    truth: list[Injection], by_device: Mapping[str, list[RaisedAlert]], verdicts: Mapping[str, str]
) -> dict[str, Any]:
    """Operators' commanded changes (expected, not anomalies) and the false alarms raised on
    their devices while the devices settled after them: each such alert is an operator's
    action reported as a fault."""
    actions = [e for e in truth if e.category == OPERATOR]
    alerted: list[RaisedAlert] = []
    for event in actions:
        alerted += [
            a
            for a in by_device.get(event.device_id, ())
            if event.start_ts <= a.raised_ms <= event.end_ts and verdicts.get(a.alert_id) == FALSE_ALARM
        ]
    return {
        "actions": count_names(e.kind for e in actions),
        "alerted": len({id(a) for a in alerted}),
        "alerted_by_rule": count_names(a.rule for a in alerted),
    }


def _rules_for(kind: str) -> frozenset[str]:
    """The rules that may detect ``kind``; none for a kind this version does not know (a
    newer simulator's): its alerts are then related, never detections or false alarms."""
    return RULES_FOR_ANOMALY_KIND.get(kind, frozenset())


def _scores(detected: int, windows: int, false: int, *, true_alerts: int | None = None) -> dict[str, float | None]:
    """Recall of the windows; precision of the alerts (``true_alerts`` detecting ones, else one
    per detected window) against the false alarms; their F1."""
    true = detected if true_alerts is None else true_alerts
    recall = detected / windows if windows else None
    precision = true / (true + false) if true + false else None
    return {"recall": rounded(recall), "precision": rounded(precision), "f1": rounded(f1(precision, recall))}


def f1(precision: float | None, recall: float | None) -> float | None:
    """The harmonic mean of ``precision`` and ``recall`` (None when either is unknown or both are 0)."""
    if precision is None or recall is None or precision + recall <= 0:
        return None
    return 2 * precision * recall / (precision + recall)


def _delays(hits: list[tuple[RaisedAlert, float, float]]) -> dict[str, float | None]:
    readings, seconds = [h[1] for h in hits], [h[2] for h in hits]
    return {
        "median_delay_readings": rounded(quantile(readings, 0.5), 2),
        "p90_delay_readings": rounded(quantile(readings, 0.9), 2),
        "median_delay_s": rounded(quantile(seconds, 0.5), 1),
        "p90_delay_s": rounded(quantile(seconds, 0.9), 1),
    }


def count_names(items: Iterable[str]) -> dict[str, int]:
    """How often each name occurs, sorted by name (the reports' tables of kinds and rules)."""
    return dict(sorted(Counter(items).items()))
