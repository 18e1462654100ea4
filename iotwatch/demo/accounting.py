"""After a demo run: where every reading went, by device and seq, and how alerts matched
the injected anomalies.

Transport: per device, the seqs in the raw Kafka topic must run from 0 to the newest
without gaps, except the ranges the ground truth declares as dropouts (the simulator
advances seq without publishing). Pipeline: every valid (device, seq) in the raw topic
must be archived, or dead-lettered by the stream as late. Whatever is left is loss.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from iotwatch.clients.kafka import list_topics
from iotwatch.settings import KafkaSettings

#: Rules that count as detecting each anomaly kind the simulator injects.
RULES_FOR_KIND: dict[str, set[str]] = {
    "crash": {"crash"}, "harsh_braking": {"crash", "anomaly_score"}, "leak": {"water_leak"},
    "hvac_stuck": {"stuck_hvac", "anomaly_score", "out_of_range"}, "dropout": {"device_silent"},
    "out_of_range": {"out_of_range", "anomaly_score"},
}
SCORE_RULES = {"anomaly_score", "fleet_anomaly", "out_of_range"}
GRACE_MS = 10_000


def read_all(kafka: KafkaSettings, topic: str, timeout_s: float = 120.0) -> list[Any]:
    """Every record of a topic, from the beginning to its end (reached per partition)."""
    partitions = list_topics(kafka).get(topic, 0)
    if not partitions:
        return []
    consumer = Consumer({**kafka.client_config(), "group.id": f"demo-accounting-{topic}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records, at_end = [], set()
    import time

    deadline = time.monotonic() + timeout_s
    while len(at_end) < partitions and time.monotonic() < deadline:
        for message in consumer.consume(5000, 1.0):
            if message.error():
                at_end.add(message.partition())
            else:
                records.append(message)
    consumer.close()
    return records


def seqs_by_device(records: Iterable[Any]) -> tuple[dict[str, set[int]], int]:
    """Device -> seqs of the readings in the raw topic, and the count of unparseable records."""
    seqs: dict[str, set[int]] = defaultdict(set)
    unparseable = 0
    for record in records:
        try:
            body = json.loads(record.value())
            seqs[str(body["device_id"])].add(int(body["seq"]))
        except (ValueError, KeyError, TypeError):
            unparseable += 1
    return seqs, unparseable


#: Ground-truth kinds whose seqs never reach the raw topic as readings: a dropout skips
#: them, a malformed payload is dead-lettered by the gateway (its seq may be unreadable).
NOT_IN_RAW = ("dropout", "malformed")


def append_times(records: Iterable[Any]) -> dict[tuple[str, int], int]:
    """(device, seq) -> when the reading was appended to the raw topic (first copy), ms."""
    times: dict[tuple[str, int], int] = {}
    for record in records:
        try:
            body = json.loads(record.value())
            times.setdefault((str(body["device_id"]), int(body["seq"])), record.timestamp()[1])
        except (ValueError, KeyError, TypeError):
            continue
    return times


def declared_ranges(truth: list[dict[str, Any]]) -> dict[str, list[tuple[int, int]]]:
    ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for item in truth:
        if item.get("kind") in NOT_IN_RAW:
            ranges[item["device_id"]].append((int(item["start_seq"]), int(item["end_seq"])))
    return ranges


def account(raw: dict[str, set[int]], archived: dict[str, set[int]], late: dict[str, set[int]],
            truth: list[dict[str, Any]]) -> dict[str, Any]:
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
    return {"devices": len(raw), "unique_readings_in_kafka": sum(len(s) for s in raw.values()),
            "archived": sum(len(s) for s in archived.values()), "late": sum(len(s) for s in late.values()),
            "declared_dropout_or_malformed_seqs": sum(e - s + 1 for r in dropouts.values() for s, e in r),
            "loss": lost, "transport_gaps": transport_gaps, "pipeline_missing": pipeline_missing}


def match_alerts(alerts: list[dict[str, Any]], truth: list[dict[str, Any]], interval_ms: dict[str, int]
                 ) -> dict[str, Any]:
    """Recall per anomaly kind, precision of raised alerts, detection delay (readings, s)."""
    raised = [a for a in alerts if a.get("state") == "raised"]
    anomalies = [t for t in truth if t.get("category") == "anomaly"]
    used: set[str] = set()
    per_kind: dict[str, dict[str, Any]] = {}
    delays_readings: list[float] = []
    for anomaly in anomalies:
        kind = anomaly["kind"]
        rules = RULES_FOR_KIND.get(kind, SCORE_RULES)
        window_end = int(anomaly["end_ts"]) + GRACE_MS
        hits = sorted((a for a in raised if a["device_id"] == anomaly["device_id"] and a["rule"] in rules
                       and int(anomaly["start_ts"]) <= int(a["first_event_ms"]) <= window_end),
                      key=lambda a: a["first_event_ms"])
        stats = per_kind.setdefault(kind, {"injected": 0, "detected": 0, "delays_s": []})
        stats["injected"] += 1
        if hits:
            stats["detected"] += 1
            delay_ms = int(hits[0]["first_event_ms"]) - int(anomaly["start_ts"])
            stats["delays_s"].append(delay_ms / 1000)
            delays_readings.append(delay_ms / max(interval_ms.get(anomaly["device_type"], 1000), 1))
            used.update(a["alert_id"] for a in hits)
    for stats in per_kind.values():
        stats["recall"] = round(stats["detected"] / stats["injected"], 3)
        delays = stats.pop("delays_s")
        stats["median_delay_s"] = round(statistics.median(delays), 2) if delays else None
    false_alarms = [a for a in raised if a["alert_id"] not in used and a["rule"] != "device_silent"]
    injected = sum(s["injected"] for s in per_kind.values())
    detected = sum(s["detected"] for s in per_kind.values())
    return {"anomalies_injected": injected, "anomalies_detected": detected,
            "recall": round(detected / injected, 3) if injected else None,
            "alerts_raised": len(raised), "alerts_matching_an_anomaly": len(used),
            "precision": round(len(used) / len(raised), 3) if raised else None,
            "false_alarms": len(false_alarms),
            "false_alarms_by_rule": dict(sorted(_count(a["rule"] for a in false_alarms).items())),
            "median_delay_readings": round(statistics.median(delays_readings), 1) if delays_readings else None,
            "by_kind": dict(sorted(per_kind.items()))}


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
