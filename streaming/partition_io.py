"""What the partition engine takes and gives: a partition's decoded records, the device
store it reads and writes, and the output of one micro-batch.

These are the engine's boundary with the Spark side (:mod:`iotwatch.streaming.processor`) and with the
tools that run it without Spark (the simulated-fleet evaluation, the dead-letter replay):
plain columns, no Spark types.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol

import numpy as np
import pandas as pd

from iotwatch.contract.alerts import AlertRecord, encode_alert
from iotwatch.contract.metric_catalog import KNOWN_METRICS
from iotwatch.contract.telemetry import DecodedBatch, decode_batch
from iotwatch.streaming.device_table import DeviceTable
from iotwatch.streaming.schemas import (
    AGGREGATE_STATS,
    READING_COLUMNS,
    SCORED_METRICS,
    WIDE_METRICS,
    score_column,
    value_column,
)

#: Columns of the aggregates (one row per device, metric and closed event-time bucket).
AGGREGATE_COLUMNS = ("device_id", "device_type", "site", "metric", "event_ms", *AGGREGATE_STATS)


@dataclass(frozen=True)
class RecordColumns:
    """One Kafka partition's records of a micro-batch, decoded, in offset order.

    ``key`` and ``raw`` may be None for a record the decoder accepted (the job packs them only
    for rejected ones): its key is its ``device_id``, and its bytes are in ``topic`` at its offset."""

    partition: int
    offset: np.ndarray  # int64
    append_ms: np.ndarray  # int64 Kafka timestamp (0: none)
    key: np.ndarray  # object: the Kafka key as text, or None
    raw: np.ndarray  # object: the original payload bytes, or None
    decoded: DecodedBatch
    topic: str | None = None  # the Kafka topic, when read from one

    def __len__(self) -> int:
        return len(self.offset)

    @classmethod
    def from_payloads(
        cls,
        partition: int,
        payloads: list[bytes | None],
        keys: list[str | None],
        offsets: list[int],
        append_ms: list[int] | None = None,
        now_ms: int | None = None,
    ) -> RecordColumns:
        """Decode raw Kafka values (what the packing stage does in the job)."""
        decoded = decode_batch(
            payloads, [None if k is None else k.encode() for k in keys], now_ms=now_ms, metrics_of=KNOWN_METRICS
        )
        raw = np.empty(len(payloads), dtype=object)
        raw[:] = payloads
        return cls(
            partition,
            np.asarray(offsets, dtype=np.int64),
            np.asarray(append_ms if append_ms is not None else [0] * len(payloads), dtype=np.int64),
            np.array(keys, dtype=object),
            raw,
            decoded,
        )


class DeviceStore(Protocol):
    """Where per-device state lives between micro-batches (Spark's state store in the job;
    :mod:`iotwatch.streaming.state_store`). Devices are loaded and saved a batch at a time, as one
    :class:`DeviceTable` in the order asked for (devices not seen before as new rows);
    ``found`` says which were known."""

    @property
    def found(self) -> np.ndarray: ...

    def load_many(self, device_ids: list[str]) -> DeviceTable: ...

    def save_many(self, table: DeviceTable, now_ms: int) -> None: ...


@cache
def _empty(columns: tuple[str, ...]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=object) for c in columns})


def empty_aggregates() -> pd.DataFrame:
    """No aggregates: a shallow copy of one kept frame (building a frame costs milliseconds,
    and most micro-batches close no bucket)."""
    return _empty(AGGREGATE_COLUMNS).copy(deep=False)


def empty_readings() -> pd.DataFrame:
    return _empty(READING_COLUMNS).copy(deep=False)


@dataclass(frozen=True)
class BatchOutput:
    """What one call emits: the scored readings (the archive's rows, in the wide layout of
    :data:`READING_COLUMNS`), the alert records, the closed aggregates, the dead letters
    (contract violations and late records, with reason and original bytes), the devices
    seen (for the silence timer) and the batch's counters."""

    readings: pd.DataFrame
    alerts: list[AlertRecord] = field(default_factory=list)
    aggregates: pd.DataFrame = field(default_factory=empty_aggregates)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    #: per device of ``devices``: its newest Kafka append time and event time (the roster's clocks)
    heard_append_ms: np.ndarray | None = None
    heard_event_ms: np.ndarray | None = None
    #: devices whose status said ``offline`` in this batch (a clean goodbye: not silence)
    goodbyes: list[str] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """Everything as dicts tagged with a ``kind`` (tests and small tools): readings
        with their ``metrics`` and ``scores`` as dicts, then alerts (the record as ``body``),
        aggregates, dead letters and a ``tally``."""
        rows: list[dict[str, Any]] = [
            {**r, "metrics": reading_metrics(r), "scores": reading_scores(r)}
            for r in self.readings.to_dict("records", into=dict)  # into=dict (the default): rows keyed by str
        ]
        rows += [
            {
                "kind": "alert",
                "device_id": a.device_id,
                "seq": a.seq,
                "event_ms": a.last_event_ms,
                "metric": a.metric,
                "body": encode_alert(a).decode(),
            }
            for a in self.alerts
        ]
        rows += [{"kind": "aggregate", **r} for r in self.aggregates.to_dict("records", into=dict)]
        rows += [dict(d) for d in self.dead_letters]
        rows.append({"kind": "tally", "body": json.dumps(self.counters)})
        return rows


def reading_metrics(row: dict[str, Any]) -> dict[str, float]:
    """A reading row's metrics (wide columns and extras) as a dict."""
    metrics = {m: row[value_column(m)] for m in WIDE_METRICS if not pd.isna(row[value_column(m)])}
    metrics.update(zip(row["extra_names"] or (), row["extra_values"] if row["extra_names"] else (), strict=True))
    return metrics


def reading_scores(row: dict[str, Any]) -> dict[str, float]:
    """A reading row's detector scores as a dict (metrics not scored are absent)."""
    scores = {m: row[score_column(m)] for m in SCORED_METRICS if not pd.isna(row[score_column(m)])}
    if row["extra_names"]:
        scores.update((m, s) for m, s in zip(row["extra_names"], row["extra_scores"], strict=True) if not np.isnan(s))
    return scores
