"""A partition's records sorted by device, each device's identity settled, and the sequence
bookkeeping of every record: the first steps of the engine, before any metric is read.

Records of a device are handled in the order Kafka appended them, which makes every result
independent of how the stream is cut into micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from iotwatch.contract.alerts import iso_time
from iotwatch.streaming.device_state import CORE_FIELDS, COUNTERS, LAST_WALL_MS
from iotwatch.streaming.device_table import DeviceTable
from iotwatch.streaming.partition_io import DeviceStore, RecordColumns
from iotwatch.streaming.sequencing import INVALID, LATE_RECORD, OUT_OF_ORDER, SCORED_RECORD, classify


@dataclass(frozen=True)
class SortedBatch:
    """One partition's records in (device, Kafka order): position ``p`` is record
    ``order[p]`` of :attr:`records`, of device ``codes[p]`` (-1: no device id), an index
    into :attr:`devices` and into the devices' state table."""

    records: RecordColumns
    devices: np.ndarray  # object: device ids, codes ascending in sorted order
    codes: np.ndarray  # int64 per position
    order: np.ndarray  # int64 record index per position
    seq: np.ndarray
    ts: np.ndarray
    event: np.ndarray
    valid: np.ndarray  # bool: a well-formed record of a device whose identity it matches
    conflict: np.ndarray  # bool: another device type or site than the device's first record

    @classmethod
    def sort(cls, records: RecordColumns, store: DeviceStore) -> tuple[SortedBatch, DeviceTable]:
        """Sort the records by device and load those devices' state from ``store``."""
        decoded = records.decoded
        key = np.where(pd.isna(records.key), decoded.device_id, records.key)
        codes, devices = pd.factorize(key, use_na_sentinel=True)
        order = np.lexsort((records.offset, codes))
        devices = np.asarray(devices, dtype=object)
        table = store.load_many(devices.tolist())
        sorted_codes = codes[order].astype(np.int64)
        valid = np.array([r is None for r in decoded.reason], dtype=bool)[order]
        conflict = _adopt_identity(records, table, order, sorted_codes, valid)
        return (
            cls(
                records,
                devices,
                sorted_codes,
                order,
                decoded.seq[order],
                decoded.ts[order],
                decoded.event[order],
                valid & ~conflict,
                conflict,
            ),
            table,
        )


def _adopt_identity(
    records: RecordColumns, table: DeviceTable, order: np.ndarray, codes: np.ndarray, valid: np.ndarray
) -> np.ndarray:
    """A device's type and site are those of its first valid record; a later record of the
    same device_id under another type or site is not merged into it but dead-lettered
    (``identity_conflict``): two devices sharing an id, or a device moved without a new id,
    must not mix their readings, seqs and detector state. Returns the conflicting positions."""
    decoded = records.decoded
    positions = np.flatnonzero(valid & (codes >= 0))
    first_codes, first = np.unique(codes[positions], return_index=True)
    new = table.device_type[first_codes] == ""
    firsts = order[positions[first[new]]]
    table.device_type[first_codes[new]] = decoded.device_type[firsts]
    table.site[first_codes[new]] = decoded.site[firsts]
    chosen = order[positions]
    differs = (decoded.device_type[chosen] != table.device_type[codes[positions]]) | (
        decoded.site[chosen] != table.site[codes[positions]]
    )
    conflict = np.zeros(len(order), dtype=bool)
    conflict[positions[differs]] = True
    return conflict


@dataclass(frozen=True)
class Sequenced:
    """The outcome of each position's sequence bookkeeping (:mod:`iotwatch.streaming.sequencing`)."""

    outcome: np.ndarray  # int8 per position
    log_gap: np.ndarray  # ms since the device's previous record in the log
    newest: np.ndarray  # the device's newest event time after the record
    prior_newest: np.ndarray  # ... and before it
    prior_high: np.ndarray  # the device's seq high-water mark before the record
    scored: np.ndarray  # positions of readings (scored and out-of-order ones)
    in_order: np.ndarray  # bool per reading: not older than the device's newest
    counters: dict[str, int]  # the batch's accounting

    @property
    def dead(self) -> np.ndarray:
        """Positions that go to the dead-letter topic (contract violations and late records)."""
        return np.flatnonzero((self.outcome <= INVALID) | (self.outcome == LATE_RECORD))


def sequence(batch: SortedBatch, table: DeviceTable, window: int, lateness_ms: int, now_ms: int) -> Sequenced:
    """Classify every position (compiled): duplicates, late records, clock steps, counter
    resets; the devices' counters in ``table`` move with it."""
    table.core = np.ascontiguousarray(table.core, dtype=np.int64)
    table.seqs = np.ascontiguousarray(table.seqs, dtype=np.uint64)
    before = table.core.copy()
    n = len(batch.order)
    outcome = np.zeros(n, dtype=np.int8)
    log_gap, newest = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    prior_newest, prior_high = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    classify(
        batch.codes,
        batch.valid,
        batch.seq.astype(np.int64),
        batch.ts.astype(np.int64),
        batch.records.append_ms[batch.order].astype(np.int64),
        table.core,
        table.seqs,
        window,
        lateness_ms,
        outcome,
        log_gap,
        newest,
        prior_newest,
        prior_high,
    )
    table.core[:, LAST_WALL_MS] = now_ms
    scored = np.flatnonzero((outcome == SCORED_RECORD) | (outcome == OUT_OF_ORDER))
    counters = {
        name: int(v) for name, v in zip(CORE_FIELDS, (table.core - before).sum(axis=0), strict=True) if name in COUNTERS
    }
    counters["no_device"] = int((batch.codes < 0).sum())
    return Sequenced(
        outcome, log_gap, newest, prior_newest, prior_high, scored, outcome[scored] == SCORED_RECORD, counters
    )


def dead_letters(
    batch: SortedBatch, sequenced: Sequenced, table: DeviceTable, lateness_ms: int
) -> list[dict[str, Any]]:
    """Contract violations and late records, with their reason and original bytes (where kept)."""
    records, decoded = batch.records, batch.records.decoded
    rows = []
    for p in sequenced.dead.tolist():
        r = batch.order[p]
        d = batch.codes[p]
        row: dict[str, Any] = {
            "kind": "dlq",
            "device_id": batch.devices[d] if d >= 0 else None,
            "device_type": (table.device_type[d] or None) if d >= 0 else None,
            "site": (table.site[d] or None) if d >= 0 else None,
            "kafka_topic": records.topic,
            "kafka_partition": records.partition,
            "kafka_offset": int(records.offset[r]),
            "raw": records.raw[r],  # None for a decoded record: read back (iotwatch.streaming.sinks.read_back)
        }
        if sequenced.outcome[p] == LATE_RECORD:
            row.update(
                kind="late",
                seq=int(decoded.seq[r]),
                event_ms=int(decoded.ts[r]),
                reason="late",
                detail=late_detail(int(decoded.ts[r]), int(sequenced.prior_newest[p]), lateness_ms),
            )
        elif batch.conflict[p]:
            row.update(
                reason="identity_conflict",
                detail=f"device {batch.devices[d]} is a {table.device_type[d]} at site {table.site[d]}; "
                f"this record says {decoded.device_type[r]} at site {decoded.site[r]}",
            )
        else:
            row.update(reason=decoded.reason[r], detail=decoded.detail[r])
        rows.append(row)
    return rows


def late_detail(event_ms: int, newest_ms: int, lateness_ms: int) -> str:
    """Why a record is late, in UTC times an operator reads (the form alert records use)."""
    return (
        f"event time {iso_time(event_ms)} is {(newest_ms - event_ms) / 1000:.1f} s older than the device's newest "
        f"{iso_time(newest_ms)} (allowed lateness {lateness_ms / 1000:g} s)"
    )
