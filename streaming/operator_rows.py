"""The stateful operator's rows: the packed chunks it is given back into a partition's
columns (:func:`unpack`), and the one tally row of counters it gives per call
(:func:`tally_row`), with the time of each step (:class:`StepClock`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from operator import attrgetter

import numpy as np
import pandas as pd

from iotwatch.contract.telemetry import DecodedBatch, decode_batch
from iotwatch.streaming.packing import dictionary_decode, packed_column
from iotwatch.streaming.partition_io import RecordColumns
from iotwatch.streaming.schemas import DICTIONARY_COLUMNS, PACKED_BUFFERS, TALLY_FIELDS, TALLY_SCHEMA, dictionary_of


class StepClock:
    """Milliseconds per step of one call, for its tally (:data:`iotwatch.streaming.schemas.TALLY_FIELDS`)."""

    def __init__(self) -> None:
        self.steps: dict[str, int] = {}
        self._last = time.perf_counter()

    def lap(self, step: str) -> None:
        now = time.perf_counter()
        self.steps[step] = round((now - self._last) * 1000)
        self._last = now


def tally_row(partition: int, counts: dict[str, int]) -> pd.DataFrame:
    """The one output row of a partition and call: its counters (absent ones are 0)."""
    values = np.fromiter((int(counts.get(name, 0)) for name in TALLY_FIELDS), dtype=np.int64, count=len(TALLY_FIELDS))
    return pd.DataFrame(
        {"kafka_partition": np.array([partition], dtype=np.int32), "counts": [values]}, columns=TALLY_SCHEMA.names
    )


def unpack(frames: Iterator[pd.DataFrame], partition: int) -> RecordColumns:
    """Packed rows (``iotwatch.streaming.schemas.PACKED_SCHEMA``) back into one partition's columns."""
    chunks = sorted((row for frame in frames for row in frame.itertuples(index=False)), key=attrgetter("first_offset"))
    if not chunks:
        empty = np.zeros(0, dtype=np.int64)
        return RecordColumns(
            partition, empty, empty, np.zeros(0, dtype=object), np.zeros(0, dtype=object), decode_batch([])
        )
    buffers = {name: [packed_column(c, name) for c in chunks] for name in PACKED_BUFFERS}

    def cat(name: str, dtype: type) -> np.ndarray:
        """The chunks' ``name`` column, one array (a copy: the buffers are read-only)."""
        parts = buffers.get(name) or [np.asarray(getattr(c, name), dtype=dtype) for c in chunks]
        return np.concatenate(parts).astype(dtype, copy=False)

    sizes = np.array([len(part) for part in buffers["offset"]], dtype=np.int64)
    bases = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    row_base = np.repeat(bases, [len(part) for part in buffers["metric_row"]])
    rejected = cat("rejected", np.int64) + np.repeat(bases, [len(part) for part in buffers["rejected"]])

    def of_rejected(name: str) -> np.ndarray:
        column = np.full(int(sizes.sum()), None, dtype=object)
        column[rejected] = cat(name, object)
        return column

    strings = {
        name: np.concatenate(
            [
                dictionary_decode(codes, getattr(c, dictionary_of(name)))
                for codes, c in zip(buffers[name], chunks, strict=True)
            ]
        )
        for name in DICTIONARY_COLUMNS
    }
    decoded = DecodedBatch(
        reason=of_rejected("reason"),
        detail=of_rejected("detail"),
        seq=cat("seq", np.int64),
        ts=cat("ts", np.int64),
        metric_row=cat("metric_row", np.int64) + row_base.astype(np.int64),
        metric_value=cat("metric_value", np.float64),
        **strings,
    )
    return RecordColumns(
        partition,
        cat("offset", np.int64),
        cat("append_ms", np.int64),
        of_rejected("key"),
        of_rejected("raw"),
        decoded,
        str(chunks[0].topic),
    )
