"""Event-time aggregates: per device, metric and bucket of ``aggregate_interval_s``, the
count, sum, extremes, last value and highest score, emitted once when the bucket closes.

Open buckets live in the device's state (:data:`iotwatch.streaming.device_state.BUCKET_FIELDS`), so a
bucket that spans micro-batches, a restart or a replay comes out the same.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from iotwatch.streaming.device_state import BUCKET_FIELDS, MAX_EVENT_MS
from iotwatch.streaming.device_table import DeviceTable
from iotwatch.streaming.partition_io import AGGREGATE_COLUMNS, empty_aggregates
from iotwatch.streaming.scored_readings import ScoredReadings


def close_buckets(
    table: DeviceTable, readings: ScoredReadings, newest: np.ndarray, bucket_ms: int, grace_ms: int
) -> pd.DataFrame:
    """Add the readings to their buckets and return the buckets that closed: a bucket closes
    when the device's event time has passed its end plus ``grace_ms`` (a reading for a bucket
    already emitted -- a clock step back -- is left out rather than overwrite it).
    ``newest`` is each reading's device's newest event time after it."""
    parts = [np.column_stack([table.bucket_device, table.buckets, np.full(len(table.buckets), -1.0)])]
    if readings.n:
        er = readings.entry_reading
        start = readings.ts[er] - readings.ts[er] % bucket_ms
        fresh = np.flatnonzero(start + bucket_ms > newest[er] - grace_ms)
        value = readings.values[fresh]
        parts.append(
            np.column_stack(
                [
                    readings.device[er][fresh],
                    start[fresh],
                    readings.pair_slot[fresh],
                    np.ones(len(fresh)),
                    value,
                    value,
                    value,
                    value,
                    np.nan_to_num(readings.entry_scores[fresh], nan=0.0),
                    fresh.astype(float),
                ]
            )
        )
    rows = _combine(np.vstack(parts))
    device = rows[:, 0].astype(np.int64)
    closing = rows[:, 1] + bucket_ms <= table.core[device, MAX_EVENT_MS] - grace_ms
    table.bucket_device, table.buckets = device[~closing], np.ascontiguousarray(rows[~closing, 1:])
    return aggregate_frame(table, device[closing], rows[closing, 1:])


def flush_buckets(table: DeviceTable) -> pd.DataFrame:
    """Every open bucket, closed now (a silent device's)."""
    aggregates = aggregate_frame(table, table.bucket_device, table.buckets)
    table.bucket_device, table.buckets = table.bucket_device[:0], table.buckets[:0]
    return aggregates


def _combine(rows: np.ndarray) -> np.ndarray:
    """Rows of ``device, BUCKET_FIELDS..., order`` combined per (device, start, metric):
    counts and sums added, extremes kept, ``last`` from the row of highest ``order``."""
    if not len(rows):
        return np.zeros((0, 1 + len(BUCKET_FIELDS)))
    # one integer key in (device, start, slot) order; a stable sort keeps the rows' own order
    # within a bucket, which is ``order``'s (the open buckets first, then the readings in turn)
    starts, _ = pd.factorize(rows[:, 1], sort=True)
    slot = rows[:, 2].astype(np.int64)
    key = (rows[:, 0].astype(np.int64) * (starts.max() + 1) + starts) * (slot.max() + 1) + slot
    order = np.argsort(key, kind="stable")
    rows, key = rows[order], key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    last = np.r_[first[1:], len(rows)] - 1
    return np.column_stack(
        [
            rows[first, :3],
            np.add.reduceat(rows[:, 3], first),
            np.add.reduceat(rows[:, 4], first),
            np.minimum.reduceat(rows[:, 5], first),
            np.maximum.reduceat(rows[:, 6], first),
            rows[last, 7],
            np.maximum.reduceat(rows[:, 8], first),
        ]
    )


def aggregate_frame(table: DeviceTable, device: np.ndarray, buckets: np.ndarray) -> pd.DataFrame:
    """Closed buckets (rows of BUCKET_FIELDS; ``device`` indexes ``table``) as
    :data:`AGGREGATE_COLUMNS`."""
    if not len(device):  # most micro-batches close no bucket: no frame to build
        return empty_aggregates()
    device = device.astype(np.int64)
    count, total = buckets[:, 2], buckets[:, 3]
    names = table.metric_name[table.metric_bounds()[device] + buckets[:, 1].astype(np.int64)]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
    return pd.DataFrame(
        {
            "device_id": table.ids[device],
            "device_type": table.device_type[device],
            "site": table.site[device],
            "metric": names,
            "event_ms": buckets[:, 0].astype(np.int64),
            "count": count.astype(np.int64),
            "sum": total,
            "min": buckets[:, 4],
            "max": buckets[:, 5],
            "last": buckets[:, 6],
            "max_score": buckets[:, 7],
            "mean": mean,
        },
        columns=list(AGGREGATE_COLUMNS),
    )
