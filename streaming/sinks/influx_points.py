"""The streaming job's InfluxDB points, through the contract's measurements
(:mod:`iotwatch.contract.measurements`): ``device_metrics`` (closed aggregates),
``alerts`` and ``pipeline`` (per micro-batch accounting and progress), and how they are written.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from influxdb_client import Point

from iotwatch.clients.influx import OutageLog, drop_kept_client, kept_client
from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.measurements import ALERTS, DEVICE_METRICS, PIPELINE
from iotwatch.errors import IotwatchError
from iotwatch.settings import InfluxSettings

#: The aggregates' columns written to ``device_metrics`` (tags, time, fields).
AGGREGATE_LINE_COLUMNS = "site device_type device_id metric event_ms mean min max last max_score count".split()


def aggregate_lines(aggregates: pd.DataFrame) -> list[str]:
    """Closed aggregates (:data:`iotwatch.streaming.partition_io.AGGREGATE_COLUMNS`), thousands a
    micro-batch, as line protocol in one pass over the frame."""
    if aggregates.empty:
        return []
    frame = aggregates[AGGREGATE_LINE_COLUMNS].astype({"count": np.int64, "event_ms": np.int64})
    return DEVICE_METRICS.lines(frame, "event_ms")


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
    lines = [line for line in lines if line]
    try:
        for start in range(0, len(lines), 5000):
            client.write_lines(lines[start : start + 5000])
    except IotwatchError as exc:
        outage.failed(exc)
        drop_kept_client(influx)
        return 1
    outage.written()
    return 0
