"""The streaming job's InfluxDB points, through the contract's measurements
(:mod:`iotwatch.contract.measurements`): ``device_metrics`` (closed aggregates),
``alerts`` and ``pipeline`` (per micro-batch accounting and progress), and how they are written.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
from influxdb_client import Point

from iotwatch.clients.influx import OutageLog, drop_kept_client, kept_client
from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.measurements import ALERTS, DEVICE_METRICS, PIPELINE
from iotwatch.errors import IotwatchError
from iotwatch.settings import InfluxSettings


def aggregate_lines(aggregates: pd.DataFrame) -> list[str]:
    """Closed aggregates (:data:`iotwatch.streaming.partition_io.AGGREGATE_COLUMNS`), thousands a
    micro-batch, as line protocol a column at a time, with millisecond times."""
    return DEVICE_METRICS.lines(aggregates.drop(columns="sum"), "event_ms")  # all but the sum


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


def pipeline_point(fields: Mapping[str, float | int | None], ts_ms: int, stage: str = "stream") -> Point:
    return PIPELINE.point({"stage": stage}, fields, ts_ms)


def write_derived(influx: InfluxSettings, outage: OutageLog, lines: list[str]) -> int:
    """Write ``lines`` through this worker's kept client (one HTTP session, kept between
    micro-batches). Metrics are derived data (recomputable from the archive): a failed write
    is logged and counted, it does not stop the pipeline. Returns the failed writes (0 or 1)."""
    client = kept_client(influx)
    try:
        for start in range(0, len(lines), 5000):
            client.write_lines(lines[start : start + 5000])
    except IotwatchError as exc:
        outage.failed(exc)
        drop_kept_client(influx)
        return 1
    outage.written()
    return 0
