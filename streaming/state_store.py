"""Where device state lives between micro-batches: shards of :class:`DeviceTable` values.

The job keeps, per Kafka partition, a ``MapState`` of shards (a hash of the device id):
one value per shard holds its devices' state as one serialised table, so a micro-batch
costs two state-store calls per shard it touches -- each call a round trip between the
Python worker and the JVM -- and numpy work over the shard's columns, never Python work
per device. Devices silent longer than the TTL are dropped when their shard is rewritten
(the store's own TTL would keep them, since the shard itself stays busy). Tests and the
simulated evaluation use the same store over a dict (:class:`MemoryStore`).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import pandas as pd

from streaming.device_state import LAST_WALL_MS, RECEIVED, DeviceState
from streaming.device_table import COMPRESSED, MAGIC, DeviceTable


class MapStateLike(Protocol):
    """The part of Spark's ``MapState`` the store uses (keys and values are tuples)."""

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None: ...

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None: ...


class DictMapState:
    """A ``MapState`` in a dict: the store without Spark."""

    def __init__(self) -> None:
        self.values: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        return self.values.get(key)

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        self.values[key] = value


class ShardedStore:
    """A partition's device states in shards; see the module's docstring."""

    def __init__(self, state: MapStateLike, shards: int, ttl_ms: int, seq_words: int, state_size: int) -> None:
        self.state, self.shards, self.ttl_ms = state, shards, ttl_ms
        self.seq_words, self.state_size = seq_words, state_size
        self._loaded: dict[int, DeviceTable] = {}
        self._shard_of = np.zeros(0, dtype=np.int64)
        self.found = np.zeros(0, dtype=bool)  # which devices of the last load_many were known
        self.written = {"state_bytes": 0, "state_devices": 0}  # by the last save_many

    def shard_of(self, device_ids: Sequence[str]) -> np.ndarray:
        return np.fromiter((zlib.crc32(d.encode()) % self.shards for d in device_ids), dtype=np.int64,
                           count=len(device_ids))

    def _read(self, shard: int) -> DeviceTable:
        value = self.state.getValue((shard,))
        if value is None:
            return DeviceTable.empty([], self.seq_words, self.state_size)
        blob = value[0]
        if blob[:len(MAGIC)] in (MAGIC, COMPRESSED):
            return DeviceTable.from_bytes(blob, self.state_size)
        entries = decode_legacy_shard(blob)
        return DeviceTable.from_states(list(entries), [DeviceState.from_value((e[1],), self.state_size)
                                                        for e in entries.values()], self.seq_words, self.state_size)

    def load_many(self, device_ids: Sequence[str]) -> DeviceTable:
        """The devices' state in the given order (new devices empty); remembered for :meth:`save_many`."""
        ids = np.asarray(list(device_ids), dtype=object)
        self._shard_of = self.shard_of(ids.tolist())
        self._loaded = {s: self._read(s) for s in np.unique(self._shard_of).tolist()}
        if not self._loaded:
            self.found = np.zeros(0, dtype=bool)
            return DeviceTable.empty([], self.seq_words, self.state_size)
        known = DeviceTable.concat(list(self._loaded.values()))
        rows = pd.Index(known.ids).get_indexer(ids) if len(known) else np.full(len(ids), -1)
        self.found = rows >= 0
        missing = np.flatnonzero(rows < 0)
        if len(missing):
            rows[missing] = len(known) + np.arange(len(missing))
            known = DeviceTable.concat([known, DeviceTable.empty(ids[missing], self.seq_words, self.state_size)])
        return known.take(rows)

    def save_many(self, table: DeviceTable, now_ms: int) -> None:
        """Write back the devices of the last :meth:`load_many` (``table``, same order), with
        the rest of their shards; devices silent past the TTL are dropped, and so are rows
        of devices never heard from (asked for, not found, given no record)."""
        self.written = {"state_bytes": 0, "state_devices": 0}
        shard_of = self._shard_of
        heard = table.core[:, RECEIVED] > 0
        if not heard.all():
            table, shard_of = table.take(np.flatnonzero(heard)), shard_of[heard]
        order = np.argsort(shard_of, kind="stable")
        by_shard = table.take(order)
        shard_of = shard_of[order]
        bounds = np.searchsorted(shard_of, np.array(sorted(self._loaded) + [self.shards]))
        for (shard, old), lo, hi in zip(sorted(self._loaded.items()), bounds[:-1], bounds[1:], strict=True):
            fresh = by_shard.slice(lo, hi)
            keep = old.core[:, LAST_WALL_MS] + self.ttl_ms > now_ms
            if len(old):
                keep &= pd.Index(fresh.ids).get_indexer(old.ids) < 0
            # (a shard whose devices all reported, or none did, needs no selection)
            merged = fresh if not keep.any() else DeviceTable.concat([old if keep.all() else old.take(
                np.flatnonzero(keep)), fresh])
            blob = merged.to_bytes()
            self.state.updateValue((shard,), (blob,))
            self.written["state_bytes"] += len(blob)
            self.written["state_devices"] += len(merged)
        self._loaded = {}

    def load(self, device_id: str) -> DeviceState | None:
        """One device's state in the per-device layout, None when unknown (tests, tools)."""
        table = self._read(int(self.shard_of([device_id])[0]))
        rows = np.flatnonzero(table.ids == device_id)
        return table.state(int(rows[0])) if len(rows) else None


class MemoryStore(ShardedStore):
    """Device state in a dict (tests, evaluation): the job's store without Spark."""

    def __init__(self, state_size: int, seq_words: int = 64, shards: int = 256) -> None:
        super().__init__(DictMapState(), shards, 2**62, seq_words, state_size)


_ENTRY = struct.Struct("<IqI")


def decode_legacy_shard(blob: bytes) -> dict[str, tuple[int, bytes]]:
    """A shard of the previous layout (one :class:`DeviceState` value per device, as
    ``(id length, last wall ms, state length, id, state)`` one after another): read so a
    checkpoint written by an earlier version resumes."""
    entries, at = {}, 0
    view = memoryview(blob)
    while at < len(blob):
        name_len, last_wall_ms, blob_len = _ENTRY.unpack_from(blob, at)
        at += _ENTRY.size
        name = bytes(view[at:at + name_len]).decode()
        at += name_len
        entries[name] = (last_wall_ms, bytes(view[at:at + blob_len]))
        at += blob_len
    return entries
