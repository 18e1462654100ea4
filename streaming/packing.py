"""Kafka records -> decoded, packed chunks, before the stateful operator: Spark's Python
stateful operators pay per row, so one row per chunk of records, carrying little
(docs/streaming-internals.md, "Packing").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from iotwatch.contract.metric_catalog import KNOWN_METRICS
from iotwatch.contract.telemetry import decode_batch
from iotwatch.streaming.operator_key import operator_key, stream_partition
from iotwatch.streaming.schemas import DICTIONARY_COLUMNS, PACKED_BUFFERS, PACKED_SCHEMA, dictionary_of

#: Records per packed row (a chunk of one partition's consecutive records).
CHUNK_RECORDS = 20_000

_SCHEMA: pa.Schema = to_arrow_schema(PACKED_SCHEMA, timezone="UTC")


def _listed(values: pa.Array[Any] | np.ndarray, type_: pa.ListType[Any]) -> pa.Array[Any]:
    """One list value holding all of ``values`` (a single-row list column)."""
    inner = values if isinstance(values, pa.Array) else pa.array(values, type=type_.value_type)
    return pa.ListArray.from_arrays(pa.array([0, len(inner)], pa.int32()), inner.cast(type_.value_type))


def _buffer(values: np.ndarray, dtype: str) -> pa.Array[Any]:
    """A single-row binary column holding ``values`` as bytes of ``dtype``."""
    return pa.array([np.ascontiguousarray(values, dtype=dtype).tobytes()], pa.binary())


def packed_column(chunk: Any, name: str) -> np.ndarray:
    """One of a packed row's :data:`iotwatch.streaming.schemas.PACKED_BUFFERS` (an attribute
    of ``chunk``: a Spark row or a pandas row) as its array, read-only over the row's bytes."""
    return np.frombuffer(getattr(chunk, name), dtype=PACKED_BUFFERS[name])


def dictionary_encode(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes (int32, -1 for None) into the distinct ``values``, and those."""
    codes, names = pd.factorize(values, use_na_sentinel=True)
    return codes.astype(np.int32), np.asarray(names, dtype=object)


def dictionary_decode(codes: np.ndarray, names: np.ndarray) -> np.ndarray:
    """The values :func:`dictionary_encode` encoded: ``names`` shared, no string made per entry."""
    return np.append(np.asarray(names, dtype=object), np.array([None]))[np.asarray(codes, dtype=np.int64)]


def pack_chunk(
    topic: str,
    partition: int,
    tasks: int,
    keys: list[bytes | None],
    values: list[bytes | None],
    offsets: np.ndarray,
    stamps_ms: np.ndarray,
) -> pa.RecordBatch:
    """Decode one chunk of one partition's records into a packed row, keyed for a stateful
    operator of ``tasks`` tasks; keys, reasons and bytes of the rejected records only."""
    decoded = decode_batch(values, keys, metrics_of=KNOWN_METRICS)
    rejected = np.flatnonzero(~decoded.valid)
    at = rejected.tolist()
    columns: dict[str, Any] = {  # arrays of numpy and of arrow
        "topic": pa.array([topic], pa.string()),
        "partition": pa.array([partition], pa.int32()),
        "operator_key": pa.array([operator_key(partition, tasks)], pa.int64()),
        "first_offset": pa.array([int(offsets[0]) if len(offsets) else 0], pa.int64()),
        "offset": offsets,
        "append_ms": stamps_ms,
        "seq": decoded.seq,
        "ts": decoded.ts,
        "metric_row": decoded.metric_row,
        "rejected": rejected.astype(np.int32),
        "key": pa.array(
            [None if (key := keys[i]) is None else key.decode("utf-8", "replace") for i in at], pa.string()
        ),
        "reason": decoded.reason[rejected],
        "detail": decoded.detail[rejected],
        "raw": pa.array([values[i] for i in at], pa.binary()),
        **{
            column: part
            for name in DICTIONARY_COLUMNS
            for column, part in zip((name, dictionary_of(name)), dictionary_encode(getattr(decoded, name)), strict=True)
        },
        "metric_value": decoded.metric_value,
    }
    for name, dtype in PACKED_BUFFERS.items():
        columns[name] = _buffer(columns[name], dtype)
    arrays = [_listed(columns[f.name], f.type) if pa.types.is_list(f.type) else columns[f.name] for f in _SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, schema=_SCHEMA)


def pack_records(
    batches: Iterator[pa.RecordBatch], tasks: int = 1, home_topic: str | None = None
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function (``tasks`` and ``home_topic`` bound with
    :func:`functools.partial`): ``key, value, topic, partition, offset, timestamp`` rows in,
    :data:`iotwatch.streaming.schemas.PACKED_SCHEMA` rows out (per topic and partition, in offset order;
    partitions numbered by :func:`iotwatch.streaming.operator_key.stream_partition`)."""
    for batch in batches:
        if not batch.num_rows:
            continue
        table = pa.Table.from_batches([batch])
        sources = table.select(["topic", "partition"]).group_by(["topic", "partition"]).aggregate([]).to_pylist()
        for source in sources:
            part = table
            if len(sources) > 1:
                in_topic = pc.equal(table["topic"], source["topic"])
                part = table.filter(pc.and_(in_topic, pc.equal(table["partition"], source["partition"])))
            if not np.all(np.diff(part["offset"].to_numpy()) > 0):  # (as the connector reads them: no copy)
                part = part.sort_by("offset")
            partition = stream_partition(source["topic"], int(source["partition"]), home_topic)
            stamps = part["timestamp"].combine_chunks().cast(pa.int64()).fill_null(0).to_numpy() // 1000
            for start in range(0, part.num_rows, CHUNK_RECORDS):
                chunk = part.slice(start, CHUNK_RECORDS)
                yield pack_chunk(
                    source["topic"],
                    partition,
                    tasks,
                    chunk["key"].to_pylist(),
                    chunk["value"].to_pylist(),
                    chunk["offset"].to_numpy(),
                    stamps[start : start + CHUNK_RECORDS],
                )
