"""The streaming job's InfluxDB points, through the contract's measurements
(:mod:`iotwatch.contract.measurements`): ``device_metrics`` (closed aggregates),
``alerts`` and ``pipeline`` (per micro-batch accounting and progress).
"""

from __future__ import annotations

from typing import Any

from influxdb_client import Point

from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.measurements import ALERTS, DEVICE_METRICS, PIPELINE


def aggregate_point(row: dict[str, Any]) -> Point:
    """One closed aggregate (:data:`iotwatch.streaming.partition_io.AGGREGATE_COLUMNS`)."""
    return DEVICE_METRICS.point(
        {name: row[name] for name in ("site", "device_type", "device_id", "metric")},
        {
            **{name: float(row[name]) for name in ("mean", "min", "max", "last", "max_score")},
            "count": int(row["count"]),
        },
        int(row["event_ms"]),
    )


def alert_point(alert: AlertRecord) -> Point:
    tags = {"severity": str(alert.severity), "rule": alert.rule, "state": str(alert.state), "site": alert.site}
    return ALERTS.point(
        {**tags, "device_type": alert.device_type, "device_id": alert.device_id},
        {
            "alert_id": alert.alert_id,
            "message": alert.message,
            "occurrences": alert.occurrences,
            "raised": 1 if alert.raised else 0,
            "score": float(alert.score),
            "value": None if alert.value is None else float(alert.value),
        },
        alert.detected_at_ms,
    )


def pipeline_point(fields: dict[str, float | int], ts_ms: int, stage: str = "stream") -> Point:
    return PIPELINE.point({"stage": stage}, fields, ts_ms)
