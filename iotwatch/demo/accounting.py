"""After a demo run: where every reading went, by device and seq, and how the alerts
judge against the injected anomalies (by the one evaluator, :mod:`iotwatch.evaluation.judgement`).

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
from iotwatch.contract.dead_letters import DeadLetter
from iotwatch.contract.detection import AnomalyKind
from iotwatch.contract.ground_truth import Injection
from iotwatch.contract.metric_catalog import DEFAULT_INTERVAL_S
from iotwatch.evaluation.judgement import JudgedRun, RaisedAlert, judge
from iotwatch.stats import rounded


@dataclass
class RawIndex:
    """The raw topic's readings, indexed by device and seq."""

    seqs: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    #: (device, seq) -> when the reading was appended to the raw topic (first copy), ms
    appended: dict[tuple[str, int], int] = field(default_factory=dict)
    #: (device, seq) -> the reading's own time (``ts``), ms
    event_ms: dict[tuple[str, int], int] = field(default_factory=dict)
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
        index.event_ms.setdefault((device, seq), int(body.get("ts") or 0))
        index.identities.setdefault(device, (str(body.get("device_type")), str(body.get("site"))))
    return index


def dead_letters(records: Iterable[Any]) -> tuple[dict[str, set[int]], dict[str, int]]:
    """The dead-letter topic's readings the stream dropped as late (device -> seqs: they are
    accounted for), and the dead letters by ``stage:reason``."""
    late: dict[str, set[int]] = defaultdict(set)
    reasons: dict[str, int] = {}
    for record in records:
        try:
            letter = DeadLetter.of_message(record.value(), record.key(), record.headers())
        except ValueError as exc:  # counted, not fatal: the report says what the topic holds
            letter = DeadLetter("unreadable", str(exc), "unknown", record.value() or b"")
        key = f"{letter.stage}:{letter.reason}"
        reasons[key] = reasons.get(key, 0) + 1
        if key == "stream:late":
            body = json.loads(letter.original)
            late[body["device_id"]].add(int(body["seq"]))
    return dict(late), reasons


#: Ground-truth kinds whose seqs never reach the raw topic as readings: a dropout skips
#: them, a malformed payload is dead-lettered by the gateway (its seq may be unreadable).
NOT_IN_RAW = ("dropout", "malformed")


def declared_ranges(truth: list[Injection]) -> dict[str, list[tuple[int, int]]]:
    ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for event in truth:
        if event.kind in NOT_IN_RAW:
            ranges[event.device_id].append((event.start_seq, event.end_seq))
    return ranges


def account(
    raw: dict[str, set[int]], archived: dict[str, set[int]], late: dict[str, set[int]], truth: list[Injection]
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


def judge_alerts(
    alerts: list[AlertRecord], truth: list[Injection], raw: RawIndex, speedup: float = 1.0
) -> tuple[dict[str, Any], dict[str, str]]:
    """The run's raised alerts judged against its ground truth by the one evaluator
    (:func:`iotwatch.evaluation.judgement.judge`, as ``iotwatch evaluate --simulated``): the
    demo's summary of its report, and each raised alert's verdict (alert id -> true,
    related, false or end_of_run).

    Every device falls silent when the simulators stop: a ``device_silent`` alert at a
    device's newest reading in the raw topic (``raw.last_seq``) that no dropout explains is
    the end of the run, left out of precision. The responder's escalation, raised on no
    reading of its own, is judged at its original alert's reading. The demo runs event
    time ``speedup`` times faster than the wall clock, and judges silence in wall time, so
    a dropout's delay in event time is given only when ``speedup`` is 1."""
    run = JudgedRun(
        device_types={device: device_type for device, (device_type, _) in raw.identities.items()},
        intervals_ms={
            device: int(DEFAULT_INTERVAL_S.get(device_type, 1.0) * 1000)
            for device, (device_type, _) in raw.identities.items()
        },
        last_seq=raw.last_seq(),
    )
    by_id = {a.alert_id: a for a in alerts if a.raised}
    raised = [RaisedAlert.of_record(a, by_id.get(a.caused_by or "")) for a in by_id.values()]
    judgement = judge(truth, raised, run)
    overall, kinds = judgement.report["overall"], judgement.report["kinds"]
    by_kind = {
        kind: {
            "injected": stats["windows"],
            "detected": stats["detected"],
            "recall": rounded(stats["recall"], 3),
            "median_delay_s": None if kind == AnomalyKind.DROPOUT and speedup != 1.0 else stats["median_delay_s"],
        }
        for kind, stats in kinds.items()
    }
    summary = {
        "anomalies_injected": overall["windows"],
        "anomalies_detected": overall["detected"],
        "recall": rounded(overall["recall"], 3),
        "alerts_raised": overall["alerts"],
        "alerts_detecting_an_anomaly": overall["true"],
        "alerts_related_to_an_anomaly": overall["related"],
        "end_of_run_silences": overall["end_of_run"],
        "precision": rounded(overall["precision"], 3),
        "false_alarms": overall["false_alarms"],
        "false_alarms_by_rule": overall["false_alarms_by_rule"],
        "median_delay_readings": overall["median_delay_readings"],
        "by_kind": by_kind,
    }
    return summary, judgement.verdicts


def archived_seqs(archive: Path) -> dict[str, set[int]]:
    """Device -> seqs present in the Parquet archive (any metric row counts)."""
    import pandas as pd

    root = archive / "readings"
    if not root.exists():
        return {}
    frame = pd.read_parquet(root, columns=["device_id", "seq"]).drop_duplicates()
    return {str(device): set(map(int, group["seq"])) for device, group in frame.groupby("device_id")}
