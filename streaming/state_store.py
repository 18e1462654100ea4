"""Where device state lives between micro-batches: shards of :class:`DeviceTable` values per
Kafka partition, two state-store calls per shard touched, never per device
(docs/streaming-internals.md, "State-store shards"). Tests and the simulated evaluation use
the same store over dicts (:class:`MemoryStore`).
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import pandas as pd

from iotwatch.streaming.device_state import LAST_WALL_MS, RECEIVED
from iotwatch.streaming.device_table import DeviceTable
from iotwatch.streaming.shard_cache import ShardCache

#: Devices a shard holds before the partition's shards grow (up to ``state_shards``).
SHARD_DEVICES = 1024


class MapStateLike(Protocol):
    """The part of Spark's ``MapState`` the store uses (keys and values are tuples)."""

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None: ...

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None: ...


class ValueStateLike(Protocol):
    """The part of Spark's ``ValueState`` the store uses."""

    def get(self) -> tuple[Any, ...] | None: ...

    def update(self, value: tuple[Any, ...]) -> None: ...


class DictMapState:
    """A ``MapState`` in a dict: the store without Spark."""

    def __init__(self) -> None:
        self.values: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        return self.values.get(key)

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        self.values[key] = value


class DictValueState:
    """A ``ValueState`` in an attribute: the store's shard tokens without Spark."""

    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def get(self) -> tuple[Any, ...] | None:
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value


class ShardedStore:
    """A partition's device states in shards; see the module's docstring."""

    def __init__(
        self,
        state: MapStateLike,
        shards: int,
        ttl_ms: int,
        seq_words: int,
        state_sizes: Sequence[int],
        tokens: ValueStateLike,
        shard_devices: int = SHARD_DEVICES,
    ) -> None:
        """``shards``: the most shards of a partition, each holding ``shard_devices`` devices
        before their count grows; ``tokens``: where the state store keeps the token of each
        shard's cached copy, and so the partition's shard count."""
        self.state, self.shards, self.ttl_ms = state, shards, ttl_ms
        self.shard_devices = shard_devices
        self.live = 0  # the served partition's shard count (0: not read yet)
        self.seq_words, self.state_sizes = seq_words, list(state_sizes)
        self.tokens = tokens
        self.cache: ShardCache | None = None
        self.partition = 0  # the grouping key the state handles serve now (see serve)
        self._token = np.zeros(shards, dtype=np.int64)
        self._loaded: dict[int, DeviceTable] = {}
        self._shard_of = np.zeros(0, dtype=np.int64)
        # each device of the last load_many: its row in the loaded shards, one after another (-1: new)
        self._rows = np.zeros(0, dtype=np.int64)
        self.written = {"state_bytes": 0, "state_devices": 0}  # by the last save_many
        self.read = {"state_shards_read": 0, "state_shards_cached": 0}  # by the last load_many

    def shard_of(self, device_ids: Sequence[str], count: int = 0) -> np.ndarray:
        """Each device's shard among ``count`` (the partition's count if 0)."""
        count = count or self.live or self.shards
        return np.fromiter((zlib.crc32(d.encode()) % count for d in device_ids), dtype=np.int64, count=len(device_ids))

    def serve(self, partition: int, cache: ShardCache | None = None) -> None:
        """Say which grouping key (Kafka partition) Spark's state handles serve now -- like
        it -- and the executor's shard cache, if any."""
        self.partition, self.cache, self.live = partition, cache, 0

    def _cache_name(self, shard: int) -> str:
        return f"{self.partition}-{shard}"

    def _read_tokens(self) -> None:
        """The served partition's shard count and tokens: one state-store call (none yet: one
        shard, or a layout older than shard tokens, refused: its other shards would go unread)."""
        value = self.tokens.get()
        if value is None and self.state.getValue((1,)) is not None:
            raise ValueError("device state in shards without shard tokens: a checkpoint older than this release")
        self._token = np.frombuffer(value[0], dtype=np.int64).copy() if value else np.zeros(1, dtype=np.int64)
        self.live = len(self._token)

    def _read_value(self, shard: int) -> bytes | None:
        token = int(self._token[shard])
        self.read["state_shards_read"] += 1
        if self.cache is not None and token:
            blob = self.cache.get(self._cache_name(shard), token)
            if blob is not None:
                self.read["state_shards_cached"] += 1
                return blob
        value = self.state.getValue((shard,))
        return None if value is None else value[0]

    def _write_value(self, shard: int, blob: bytes) -> None:
        self.state.updateValue((shard,), (blob,))
        self._token[shard] = 0  # 0 means "no copy"
        if self.cache is not None:
            token = secrets.randbits(62) + 1
            self._token[shard] = token
            self.cache.put(self._cache_name(shard), token, blob)

    def _read(self, shard: int) -> DeviceTable:
        blob = self._read_value(shard)
        if blob is None:
            return DeviceTable.empty([], self.seq_words, self.state_sizes)
        return DeviceTable.from_bytes(blob, self.state_sizes)

    @property
    def found(self) -> np.ndarray:
        """Which devices of the last :meth:`load_many` were known."""
        return self._rows >= 0

    def load_many(self, device_ids: Sequence[str]) -> DeviceTable:
        """The devices' state in the given order (new devices empty); remembered for :meth:`save_many`."""
        ids = np.asarray(list(device_ids), dtype=object)
        self._read_tokens()
        self._shard_of = self.shard_of(ids.tolist())
        self.read = {"state_shards_read": 0, "state_shards_cached": 0}
        self._loaded = {s: self._read(s) for s in np.unique(self._shard_of).tolist()}
        if not self._loaded:
            self._rows = np.zeros(0, dtype=np.int64)
            return DeviceTable.empty([], self.seq_words, self.state_sizes)
        known = DeviceTable.concat(list(self._loaded.values()))
        self._rows = pd.Index(known.ids).get_indexer(pd.Index(ids)) if len(known) else np.full(len(ids), -1)
        rows, missing = self._rows.copy(), np.flatnonzero(self._rows < 0)
        if len(missing):
            rows[missing] = len(known) + np.arange(len(missing))
            known = DeviceTable.concat([known, DeviceTable.empty(ids[missing], self.seq_words, self.state_sizes)])
        return known.take(rows)

    def save_many(self, table: DeviceTable, now_ms: int) -> None:
        """Write back the devices of the last :meth:`load_many` (``table``, same order), with
        the rest of their shards; devices silent past the TTL are dropped, and so are rows
        of devices never heard from (asked for, not found, given no record)."""
        self.written = {"state_bytes": 0, "state_devices": 0}
        shard_of = self._shard_of
        heard = table.core[:, RECEIVED] > 0
        shards = sorted(self._loaded.items())  # (in load_many's order: the rows of self._rows)
        at = np.cumsum([0] + [len(old) for _, old in shards])
        reported = np.zeros(at[-1], dtype=bool)  # the loaded devices that come back in ``table``
        reported[self._rows[self.found & heard]] = True
        if not heard.all():
            table, shard_of = table.take(np.flatnonzero(heard)), shard_of[heard]
        order = np.argsort(shard_of, kind="stable")
        by_shard = table.take(order)
        shard_of = shard_of[order]
        bounds = np.searchsorted(shard_of, np.array(sorted(self._loaded) + [self.live]))
        merged: dict[int, DeviceTable] = {}
        for (shard, old), a, lo, hi in zip(shards, at[:-1], bounds[:-1], bounds[1:], strict=True):
            fresh = by_shard.slice(lo, hi)
            keep = self._alive(old, now_ms) & ~reported[a : a + len(old)]
            # (a shard whose devices all reported, or none did, needs no selection)
            merged[shard] = (
                fresh
                if not keep.any()
                else DeviceTable.concat([old if keep.all() else old.take(np.flatnonzero(keep)), fresh])
            )
        if self.live < self.shards and merged and max(map(len, merged.values())) > self.shard_devices:
            merged = self._regrouped(merged, now_ms)
        for shard, table_of_shard in merged.items():
            blob = table_of_shard.to_bytes()
            self._write_value(shard, blob)
            self.written["state_bytes"] += len(blob)
            self.written["state_devices"] += len(table_of_shard)
        if self._loaded:
            self.tokens.update((self._token.tobytes(),))
        self._loaded = {}

    def _alive(self, table: DeviceTable, now_ms: int) -> np.ndarray:
        """Which of ``table``'s devices were heard within the TTL."""
        return np.asarray(table.core[:, LAST_WALL_MS] + self.ttl_ms > now_ms)

    def _regrouped(self, merged: dict[int, DeviceTable], now_ms: int) -> dict[int, DeviceTable]:
        """The partition's devices (``merged`` and the shards not touched) in as many shards
        as hold ``shard_devices`` each, at most ``shards``; the count grows to that."""
        rest = [self._read(s) for s in range(self.live) if s not in merged]
        everyone = DeviceTable.concat(
            [*merged.values(), *(t.take(np.flatnonzero(self._alive(t, now_ms))) for t in rest)]
        )
        count = min(self.shards, max(self.live + 1, -(-len(everyone) // self.shard_devices)))
        shard_of = self.shard_of(everyone.ids.tolist(), count)
        self.live, self._token = count, np.zeros(count, dtype=np.int64)
        return {s: everyone.take(np.flatnonzero(shard_of == s)) for s in range(count)}

    def load(self, device_id: str) -> DeviceTable | None:
        """One device's state (a table of one row), None when unknown (tests, tools)."""
        self._read_tokens()
        table = self._read(int(self.shard_of([device_id])[0]))
        rows = np.flatnonzero(table.ids == device_id)
        return table.take(rows) if len(rows) else None


class MemoryStore(ShardedStore):
    """Device state in dicts (tests, evaluation): the job's store without Spark."""

    def __init__(
        self, state_sizes: Sequence[int], seq_words: int = 64, shards: int = 256, shard_devices: int = SHARD_DEVICES
    ) -> None:
        super().__init__(DictMapState(), shards, 2**62, seq_words, state_sizes, DictValueState(), shard_devices)
