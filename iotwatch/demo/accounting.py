"""After a demo run: where every reading went, by device and seq, and how alerts matched
the injected anomalies.

Transport: per device, the seqs in the raw Kafka topic must run from 0 to the newest
without gaps, except the ranges the ground truth declares as dropouts (the simulator
advances seq without publishing). Pipeline: every valid (device, seq) in the raw topic
must be archived, or dead-lettered by the stream as late. Whatever is left is loss.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.detection import MEASUREMENT_RULES, RULES_FOR_ANOMALY_KIND
from iotwatch.stats import quantile, rounded
from streaming import rules

#: Rules that count as detecting each anomaly kind the simulator injects: the table
#: ``iotwatch evaluate --simulated`` judges by too.
RULES_FOR_KIND = RULES_FOR_ANOMALY_KIND
#: Rules whose alert an anomaly of a metric explains (no false alarm) though they need not
#: count as detecting its kind: the measurement rules, and a value pushed out of range.
SCORE_RULES = MEASUREMENT_RULES | {rules.OUT_OF_RANGE}
#: Other rules an anomaly explains (no false alarm), besides its own and the score rules:
#: a crash's deceleration passes through the harsh-braking band.
ALSO_EXPLAINS: dict[str, frozenset[str]] = {"crash": frozenset({rules.HARSH_BRAKING})}
GRACE_MS = 10_000


@dataclass
class RawIndex:
    """The raw topic's readings, indexed by device and seq."""

    seqs: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    #: (device, seq) -> when the reading was appended to the raw topic (first copy), ms
    appended: dict[tuple[str, int], int] = field(default_factory=dict)
    #: device -> (device_type, site)
    identities: dict[str, tuple[str, str]] = field(default_factory=dict)
    unparseable: int = 0

    def last_seq(self) -> dict[str, int]:
        return {device: max(seqs) for device, seqs in self.seqs.items() if seqs}


def index_raw(records: Iterable[Any]) -> RawIndex:
    index = RawIndex()
    for record in records:
        try:
            body = json.loads(record.value())
            device, seq = str(body["device_id"]), int(body["seq"])
        except (ValueError, KeyError, TypeError):
            index.unparseable += 1
            continue
        index.seqs[device].add(seq)
        index.appended.setdefault((device, seq), record.timestamp()[1])
        index.identities.setdefault(device, (str(body.get("device_type")), str(body.get("site"))))
    return index


#: Ground-truth kinds whose seqs never reach the raw topic as readings: a dropout skips
#: them, a malformed payload is dead-lettered by the gateway (its seq may be unreadable).
NOT_IN_RAW = ("dropout", "malformed")


def declared_ranges(truth: list[dict[str, Any]]) -> dict[str, list[tuple[int, int]]]:
    ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for item in truth:
        if item.get("kind") in NOT_IN_RAW:
            ranges[item["device_id"]].append((int(item["start_seq"]), int(item["end_seq"])))
    return ranges


def account(
    raw: dict[str, set[int]], archived: dict[str, set[int]], late: dict[str, set[int]], truth: list[dict[str, Any]]
) -> dict[str, Any]:
    """Loss by seq at the transport and in the pipeline (both must be 0)."""
    dropouts = declared_ranges(truth)
    transport_gaps: dict[str, list[int]] = {}
    for device, seqs in raw.items():
        declared = {s for start, end in dropouts.get(device, []) for s in range(start, end + 1)}
        missing = sorted(set(range(max(seqs) + 1)) - seqs - declared)
        if missing:
            transport_gaps[device] = missing[:20]
    pipeline_missing: dict[str, list[int]] = {}
    for device, seqs in raw.items():
        missing = sorted(seqs - archived.get(device, set()) - late.get(device, set()))
        if missing:
            pipeline_missing[device] = missing[:20]
    lost = sum(len(v) for v in transport_gaps.values()) + sum(len(v) for v in pipeline_missing.values())
    return {
        "devices": len(raw),
        "unique_readings_in_kafka": sum(len(s) for s in raw.values()),
        "archived": sum(len(s) for s in archived.values()),
        "late": sum(len(s) for s in late.values()),
        "declared_dropout_or_malformed_seqs": sum(e - s + 1 for r in dropouts.values() for s, e in r),
        "loss": lost,
        "transport_gaps": transport_gaps,
        "pipeline_missing": pipeline_missing,
    }


#: What a raised alert was, judged against the ground truth (see :func:`match_alerts`).
MATCHED, FALSE_ALARM, END_OF_RUN = "matched", "false_alarm", "end_of_run"


def _during(
    anomaly: dict[str, Any], raised: list[AlertRecord], interval_ms: int, rule_names: frozenset[str]
) -> list[AlertRecord]:
    """Raised alerts of ``rule_names`` on the anomaly's device whose episode began with a reading
    of the anomaly (or of the grace period after it), earliest first. Matched by seq, which
    clock-skew faults leave alone (the ground truth's times are the simulator's; a skewed
    device reports other event times). A dropout's ``device_silent`` alert carries the
    newest reading before the silence: one seq before the dropout's first, which never
    arrives."""
    dropout = anomaly["kind"] == "dropout"
    low = int(anomaly["start_seq"]) - (1 if dropout else 0)
    high = int(anomaly["end_seq"]) + (0 if dropout else GRACE_MS // max(interval_ms, 1))
    hits = [
        a
        for a in raised
        if a.device_id == anomaly["device_id"] and a.rule in rule_names and low <= int(a.start_seq) <= high
    ]
    return sorted(hits, key=lambda a: int(a.start_seq))


def match_alerts(
    alerts: list[AlertRecord],
    truth: list[dict[str, Any]],
    interval_ms: dict[str, int],
    last_seq: dict[str, int] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Recall per anomaly kind, precision of raised alerts, detection delay (readings, s);
    and each raised alert's verdict (alert id -> matched, false_alarm or end_of_run).

    An anomaly is detected by an alert of its kind's rules (``RULES_FOR_KIND``); an alert
    is matched (no false alarm) when an injected anomaly on its device explains it: one of
    those rules, a score rule or ``ALSO_EXPLAINS`` (a score alert on a crashing vehicle's
    acceleration is right, though only the crash rule counts as detecting the crash).

    ``last_seq`` (device -> its newest seq in the raw topic) tells the end of the run: a
    ``device_silent`` alert raised after a device's last reading, with no injected dropout
    to explain it, is the simulators stopping, neither a detection nor a false alarm; it
    is left out of precision. Delays count readings from the anomaly's first to the one
    that began the alert (in seconds: times the device's reporting interval); none is
    given for dropouts, whose silence is judged in wall time."""
    raised = [a for a in alerts if a.raised]
    anomalies = [t for t in truth if t.get("category") == "anomaly"]
    used: set[str] = set()
    per_kind: dict[str, dict[str, Any]] = {}
    delays_readings: list[float] = []
    for anomaly in anomalies:
        kind = anomaly["kind"]
        interval = interval_ms.get(anomaly["device_type"], 1000)
        kind_rules = RULES_FOR_KIND.get(kind, SCORE_RULES)
        hits = _during(anomaly, raised, interval, kind_rules)
        explaining = (
            kind_rules if kind == "dropout" else kind_rules | SCORE_RULES | ALSO_EXPLAINS.get(kind, frozenset())
        )
        explained = _during(anomaly, raised, interval, explaining)
        used.update(a.alert_id for a in explained)
        stats = per_kind.setdefault(kind, {"injected": 0, "detected": 0, "delays_s": []})
        stats["injected"] += 1
        if hits:
            stats["detected"] += 1
            if kind != "dropout":
                readings = int(hits[0].start_seq) - int(anomaly["start_seq"])
                stats["delays_s"].append(readings * interval / 1000)
                delays_readings.append(readings)
    for stats in per_kind.values():
        stats["recall"] = round(stats["detected"] / stats["injected"], 3)
        delays = stats.pop("delays_s")
        stats["median_delay_s"] = rounded(quantile(delays, 0.5), 2)
    ends = last_seq or {}
    verdicts: dict[str, str] = {}
    for alert in raised:
        if alert.alert_id in used:
            verdicts[alert.alert_id] = MATCHED
        elif alert.rule == "device_silent" and int(alert.seq) >= ends.get(alert.device_id, 1 << 62):
            verdicts[alert.alert_id] = END_OF_RUN
        else:
            verdicts[alert.alert_id] = FALSE_ALARM
    false_alarms = [a for a in raised if verdicts[a.alert_id] == FALSE_ALARM]
    matched = sum(1 for a in raised if verdicts[a.alert_id] == MATCHED)
    judged = sum(1 for a in raised if verdicts[a.alert_id] != END_OF_RUN)
    injected = sum(s["injected"] for s in per_kind.values())
    detected = sum(s["detected"] for s in per_kind.values())
    summary = {
        "anomalies_injected": injected,
        "anomalies_detected": detected,
        "recall": round(detected / injected, 3) if injected else None,
        "alerts_raised": len(raised),
        "alerts_matching_an_anomaly": matched,
        "end_of_run_silences": len(raised) - judged,
        "precision": round(matched / judged, 3) if judged else None,
        "false_alarms": len(false_alarms),
        "false_alarms_by_rule": dict(sorted(_count(a.rule for a in false_alarms).items())),
        "median_delay_readings": rounded(quantile(delays_readings, 0.5), 1),
        "by_kind": dict(sorted(per_kind.items())),
    }
    return summary, verdicts


def _count(items: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        counts[item] += 1
    return counts


def archived_seqs(archive: Path) -> dict[str, set[int]]:
    """Device -> seqs present in the Parquet archive (any metric row counts)."""
    import pandas as pd

    root = archive / "readings"
    if not root.exists():
        return {}
    frame = pd.read_parquet(root, columns=["device_id", "seq"]).drop_duplicates()
    return {str(device): set(map(int, group["seq"])) for device, group in frame.groupby("device_id")}
