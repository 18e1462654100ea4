"""InfluxDB points of the streaming job (measurements the dashboards query).

- ``device_metrics``: per device, metric and event-time bucket (tags site, device_type,
  device_id, metric; fields mean, min, max, last, count, max_score);
- ``alerts``: one point per raised/cleared alert (tags severity, rule, state, site,
  device_type, device_id; fields score, value, occurrences, alert_id, message);
- ``pipeline``: per micro-batch accounting and throughput (tag stage=stream).
"""

from __future__ import annotations

from typing import Any

from influxdb_client import Point

from iotwatch.contract.alerts import AlertRecord


def aggregate_point(row: dict[str, Any]) -> Point:
    """One closed aggregate (:data:`streaming.engine.AGGREGATE_COLUMNS`)."""
    stats = row
    point = (
        Point("device_metrics")
        .tag("site", row["site"])
        .tag("device_type", row["device_type"])
        .tag("device_id", row["device_id"])
        .tag("metric", row["metric"])
        .time(int(row["event_ms"]), "ms")
    )
    for name in ("mean", "min", "max", "last", "max_score"):
        point = point.field(name, float(stats[name]))
    return point.field("count", int(stats["count"]))


def alert_point(alert: AlertRecord) -> Point:
    point = (
        Point("alerts")
        .tag("severity", str(alert.severity))
        .tag("rule", alert.rule)
        .tag("state", str(alert.state))
        .tag("site", alert.site)
        .tag("device_type", alert.device_type)
        .tag("device_id", alert.device_id)
        .field("alert_id", alert.alert_id)
        .field("message", alert.message)
        .field("occurrences", alert.occurrences)
        .field("raised", 1 if alert.raised else 0)
        .field("score", float(alert.score))
        .time(alert.detected_at_ms, "ms")
    )
    if alert.value is not None:
        point = point.field("value", float(alert.value))
    return point


def pipeline_point(fields: dict[str, float | int], ts_ms: int, stage: str = "stream") -> Point:
    point = Point("pipeline").tag("stage", stage).time(ts_ms, "ms")
    for name, value in fields.items():
        if value is not None:
            point = point.field(name, value)
    return point
