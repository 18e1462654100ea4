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
    entries = [np.zeros(0)] * (1 + len(BUCKET_FIELDS))
    if readings.n:
        er = readings.entry_reading
        start = readings.ts[er] - readings.ts[er] % bucket_ms
        fresh = np.flatnonzero(start + bucket_ms > newest[er] - grace_ms)
        value = readings.values[fresh]
        score = np.nan_to_num(readings.entry_scores[fresh], nan=0.0)
        entries = [readings.device[er][fresh], start[fresh], readings.pair_slot[fresh], np.ones(len(fresh))]
        entries += [value, value, value, value, score]
    device, rows = _combine(table.bucket_device, table.buckets, entries)
    closing = rows[:, 0] + bucket_ms <= table.core[device, MAX_EVENT_MS] - grace_ms
    table.bucket_device, table.buckets = device[~closing], rows[~closing]
    return aggregate_frame(table, device[closing], rows[closing])


def flush_buckets(table: DeviceTable) -> pd.DataFrame:
    """Every open bucket, closed now (a silent device's)."""
    aggregates = aggregate_frame(table, table.bucket_device, table.buckets)
    table.bucket_device, table.buckets = table.bucket_device[:0], table.buckets[:0]
    return aggregates


def _combine(device: np.ndarray, rows: np.ndarray, entries: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The open buckets (``device``, rows of BUCKET_FIELDS in (device, start, metric) order)
    with the ``entries`` (columns: device, BUCKET_FIELDS) added in turn: counts and sums
    added, extremes kept, ``last`` from the last entry. Only the entries are sorted, then
    merged after the open rows of their bucket: re-sorting the open rows, which outnumber a
    batch's entries, cost most of the step; the rows of a bucket meet in the same order."""
    n = len(device)
    device = np.concatenate([device, entries[0]]).astype(np.int64)
    columns = [np.concatenate([rows[:, c], entries[c + 1]]) for c in range(len(BUCKET_FIELDS))]
    if not len(device):
        return device, rows[:0]
    # one integer key in (device, start, slot) order
    start, slot = columns[0].astype(np.int64), columns[1].astype(np.int64)
    start, span = start - start.min(), int(start.max() - start.min()) + 1
    if (int(device.max()) + 1) * span * (int(slot.max()) + 1) >= 2**62:  # event times years apart
        start = pd.factorize(start, sort=True)[0]
        span = int(start.max()) + 1
    key = (device * span + start) * (int(slot.max()) + 1) + slot
    if (np.diff(key[:n]) <= 0).any():  # open rows out of order (not written by this step): sort all
        order = np.argsort(key, kind="stable")
    else:  # the entries sorted, each merged after its bucket's open row
        later = n + np.argsort(key[n:], kind="stable")
        order, merged = np.empty(len(key), dtype=np.int64), key[later]
        order[np.arange(n) + np.searchsorted(merged, key[:n])] = np.arange(n)
        order[np.arange(len(later)) + np.searchsorted(key[:n], merged, "right")] = later
    key = key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    last = np.r_[first[1:], len(key)] - 1
    head, count, total, low, high, score = order[first], *(columns[c][order] for c in (2, 3, 4, 5, 7))
    reduced = [np.add.reduceat(count, first), np.add.reduceat(total, first), np.minimum.reduceat(low, first)]
    reduced += [np.maximum.reduceat(high, first), columns[6][order[last]], np.maximum.reduceat(score, first)]
    return device[head], np.column_stack([columns[0][head], columns[1][head], *reduced])


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
