"""The Parquet archive of clean readings (the batch layer's master dataset), written by the
stateful task that scored them: a reading never travels back into the JVM
(docs/streaming-internals.md, "The archive sink").
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from iotwatch.streaming.schemas import SCORED_METRICS, WIDE_METRICS, score_column, value_column

_METRICS_TYPE = pa.struct([pa.field(m, pa.float64()) for m in WIDE_METRICS])
_SCORES_TYPE = pa.struct([pa.field(m, pa.float64()) for m in SCORED_METRICS])
_MAP_TYPE = pa.map_(pa.string(), pa.float64())

#: The archive's file schema, one row per reading: its metrics and detector scores as structs
#: of the wide layout, uncatalogued ones as maps (the partition columns ``date`` and
#: ``device_type`` are directories: :func:`partition_folders`).
_ARCHIVE_TYPES: dict[str, pa.DataType] = {
    "device_id": pa.string(),
    "site": pa.string(),
    "seq": pa.int64(),
    "event_ms": pa.int64(),
    "event_time": pa.timestamp("us", tz="UTC"),
    "metrics": _METRICS_TYPE,
    "scores": _SCORES_TYPE,
    "out_of_range": pa.list_(pa.string()),
    "extra_metrics": _MAP_TYPE,
    "extra_scores": _MAP_TYPE,
    "detector": pa.string(),
}
ARCHIVE_SCHEMA = pa.schema(_ARCHIVE_TYPES)
_DICTIONARY_COLUMNS = ["device_id", "site", "detector"]
_VALUE_COLUMNS = [value_column(m) for m in WIDE_METRICS]
_SCORE_COLUMNS = [score_column(m) for m in SCORED_METRICS]


def file_name(partition: int, first_offset: int, last_offset: int) -> str:
    """An archive file's name: the Kafka partition and the offsets its rows were read from,
    zero-padded so that names sort in offset order."""
    return f"part-{partition:05d}-{first_offset:019d}-{last_offset:019d}.parquet"


def _struct(block: np.ndarray, kind: pa.StructType) -> pa.Array[Any]:
    """One struct array of ``block``'s columns (NaN is 'absent' in the reading frame and null
    in the archive)."""
    return pa.StructArray.from_arrays(
        [pa.array(block[:, i], type=pa.float64(), from_pandas=True) for i in range(block.shape[1])], fields=list(kind)
    )


def _maps(names: pd.Series, values: pd.Series, keep_nan: bool) -> pa.Array[Any]:
    """``names[i] -> values[i]`` per row (null where the row has no extras); a NaN value is
    dropped where ``keep_nan`` is false (an extra metric that was not scored has no score)."""
    offsets, keys, items, valid = [0], [], [], []
    for row_names, row_values in zip(names.tolist(), values.tolist(), strict=True):
        if row_names is None:
            valid.append(False)
        else:
            pairs = [(n, float(v)) for n, v in zip(row_names, row_values, strict=True) if keep_nan or v == v]
            keys += [n for n, _ in pairs]
            items += [v for _, v in pairs]
            valid.append(True)
        offsets.append(len(keys))
    mask = pa.array([not v for v in valid], type=pa.bool_())
    return pa.MapArray.from_arrays(  # type: ignore[call-overload, no-any-return]  # stubs: no int32 offsets, no type=
        pa.array(offsets, type=pa.int32()),
        pa.array(keys, type=pa.string()),
        pa.array(items, type=pa.float64()),
        type=_MAP_TYPE,
        mask=mask,
    )


def archive_table(readings: pd.DataFrame, detector: str) -> pa.Table:
    """The reading rows of :class:`iotwatch.streaming.partition_io.BatchOutput` in the archive's layout."""
    event_ms = readings["event_ms"].to_numpy(dtype=np.int64)
    # the values and scores as one float block: one copy, where a column at a time costs pandas' lookups
    block = readings[_VALUE_COLUMNS + _SCORE_COLUMNS].to_numpy(dtype=np.float64)
    has_extras = readings["extra_names"].notna().any()
    n = len(readings)
    no_maps = pa.nulls(n, type=_MAP_TYPE)
    columns: list[pa.Array[Any]] = [
        pa.array(readings["device_id"].to_numpy(), type=pa.string()),
        pa.array(readings["site"].to_numpy(), type=pa.string()),
        pa.array(readings["seq"].to_numpy(dtype=np.int64), type=pa.int64()),
        pa.array(event_ms, type=pa.int64()),
        pa.array(event_ms.astype("datetime64[ms]").astype("datetime64[us]"), type=pa.timestamp("us")).cast(
            pa.timestamp("us", tz="UTC")
        ),
        _struct(block[:, : len(WIDE_METRICS)], _METRICS_TYPE),
        _struct(block[:, len(WIDE_METRICS) :], _SCORES_TYPE),
        pa.array(readings["out_of_range"].to_numpy(), type=pa.list_(pa.string()), from_pandas=True),
        _maps(readings["extra_names"], readings["extra_values"], keep_nan=True) if has_extras else no_maps,
        _maps(readings["extra_names"], readings["extra_scores"], keep_nan=False) if has_extras else no_maps,
        pa.repeat(pa.scalar(detector, pa.string()), n),
    ]
    return pa.Table.from_arrays(columns, schema=ARCHIVE_SCHEMA)


def partition_folders(readings: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Each reading's folder of the archive, ``date=<day>/device_type=<type>``, as a code into
    the list of the folders present: the date formatted once per day, not once per reading."""
    day_codes, days = pd.factorize(readings["event_ms"].to_numpy(dtype=np.int64) // 86_400_000)
    type_codes, device_types = pd.factorize(readings["device_type"].to_numpy())
    dates = np.datetime_as_string(np.asarray(days, dtype="datetime64[D]"), unit="D")
    codes, pairs = pd.factorize(day_codes * len(device_types) + type_codes)
    folders = [
        f"date={dates[pair // len(device_types)]}/device_type={device_types[pair % len(device_types)]}"
        for pair in np.asarray(pairs).tolist()
    ]
    return codes, folders


class ArchiveWriter:
    """Writes one partition's readings of one micro-batch: a file per date and device type."""

    def __init__(self, root: str, detector: str) -> None:
        self.readings_dir = Path(root) / "readings"
        self.detector = detector

    def write(self, readings: pd.DataFrame, partition: int, first_offset: int, last_offset: int) -> int:
        """Archive ``readings`` (read from Kafka offsets ``first_offset..last_offset`` of
        ``partition``); returns the files written."""
        if readings.empty:
            return 0
        table = archive_table(readings, self.detector)
        codes, folders = partition_folders(readings)
        name = file_name(partition, first_offset, last_offset)
        for code, relative in enumerate(folders):
            folder = self.readings_dir / relative
            folder.mkdir(parents=True, exist_ok=True)
            temporary = folder / f".{name}.{uuid.uuid4().hex}.tmp"
            rows = table if len(folders) == 1 else table.take(np.flatnonzero(codes == code))
            # a dictionary for the strings only: tried on the numbers, it costs a quarter of the write
            pq.write_table(
                rows,
                temporary,
                compression="snappy",
                use_dictionary=_DICTIONARY_COLUMNS,  # type: ignore[arg-type]  # stubs: bool only; pyarrow takes names
            )
            os.replace(temporary, folder / name)
        return len(folders)
