"""The archive's rows: one row per reading in the wide layout of
:data:`iotwatch.streaming.schemas.READING_COLUMNS`, built by scattering the entries into columns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from iotwatch.streaming.schemas import SCORED_METRICS, WIDE_METRICS, score_column, value_column
from iotwatch.streaming.scored_readings import ScoredReadings
from iotwatch.streaming.sorted_batch import SortedBatch

_WIDE_INDEX = {m: i for i, m in enumerate(WIDE_METRICS)}
_SCORED_INDEX = {m: i for i, m in enumerate(SCORED_METRICS)}
_BLOCK_COLUMNS = [value_column(m) for m in WIDE_METRICS] + [score_column(m) for m in SCORED_METRICS]


def reading_frame(batch: SortedBatch, scored: np.ndarray, site: np.ndarray, readings: ScoredReadings) -> pd.DataFrame:
    """A column per catalogued metric and score (no per-row objects), extras only where
    present; ``scored`` are the readings' positions in ``batch``, ``site`` the sites of the
    batch's devices."""
    m = readings.n
    records = batch.order[scored]
    columns: dict[str, Any] = {
        "kind": np.full(m, "reading", dtype=object),
        "device_id": batch.devices[readings.device] if m else np.zeros(0, dtype=object),
        "device_type": readings.device_type,
        "site": site[readings.device],
        "seq": readings.seq.astype(np.int64),
        "event_ms": readings.ts.astype(np.int64),
        "kafka_partition": np.full(m, batch.records.partition, dtype=np.int32),
        "kafka_offset": batch.records.offset[records].astype(np.int64),
        "body": np.full(m, None, dtype=object),
    }
    name_codes, names = pd.factorize(readings.names)
    wide_of = np.array([_WIDE_INDEX.get(n, -1) for n in names] + [-1], dtype=np.int64)[name_codes]
    scored_of = np.array([_SCORED_INDEX.get(n, -1) for n in names] + [-1], dtype=np.int64)[name_codes]
    # the value and score columns as one float block, laid out as pandas keeps a block (a row
    # per column), so the frame takes it without the copy that assembling columns costs
    block = np.full((len(WIDE_METRICS) + len(SCORED_METRICS), m), np.nan)
    hit = wide_of >= 0
    block[wide_of[hit], readings.entry_reading[hit]] = readings.values[hit]
    hit = scored_of >= 0
    block[len(WIDE_METRICS) + scored_of[hit], readings.entry_reading[hit]] = readings.entry_scores[hit]
    extra = wide_of < 0
    tail = {
        "out_of_range": _grouped(readings.entry_reading, readings.names, readings.entry_oor, m),
        "extra_names": _grouped(readings.entry_reading, readings.names, extra, m),
        "extra_values": _grouped(readings.entry_reading, readings.values, extra, m),
        "extra_scores": _grouped(readings.entry_reading, readings.entry_scores, extra, m),
    }
    return pd.concat(
        [pd.DataFrame(columns), pd.DataFrame(block.T, columns=_BLOCK_COLUMNS, copy=False), pd.DataFrame(tail)],
        axis=1,
        copy=False,
    )


def _grouped(entry_reading: np.ndarray, values: np.ndarray, mask: np.ndarray, n: int) -> np.ndarray:
    """Per reading, its entries where ``mask`` holds, as an array (None where it has none):
    an object column of few non-null cells, cheap to convert."""
    out = np.full(n, None, dtype=object)
    hits = np.flatnonzero(mask)
    if len(hits):
        rows, starts = np.unique(entry_reading[hits], return_index=True)
        for row, piece in zip(rows.tolist(), np.split(values[hits], starts[1:]), strict=True):
            out[row] = piece
    return out
