"""Device state as columns: the table's layout and the sharded store."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from iotwatch.settings import StreamSettings
from iotwatch.streaming.device_state import LAST_WALL_MS, RECEIVED
from iotwatch.streaming.device_table import DeviceTable
from iotwatch.streaming.shard_cache import ShardCache
from iotwatch.streaming.state_store import DictMapState, DictValueState, MemoryStore, ShardedStore
from tests.unit.streaming.test_engine import Harness, _comparable, record


def _filled(devices: int = 5, settings: StreamSettings | None = None) -> tuple[Harness, list[str]]:
    """A harness whose devices have metrics, detector rows, open buckets and an open episode."""
    harness = Harness(settings)
    ids = [f"th-{d}" for d in range(devices)]
    batch = [
        record(
            i,
            device=d,
            offset=i * devices + k,
            temperature=21.0 + (9.0 if (d, i) == ("th-1", 150) else 0),
            humidity_pct=40.0 + k,
        )
        for i in range(151)
        for k, d in enumerate(ids)
    ]
    harness.process(batch)
    return harness, ids


def _same(a: DeviceTable, b: DeviceTable) -> None:
    assert len(a.detectors) == len(b.detectors)
    for bank, (rows, other) in enumerate(zip(a.detectors, b.detectors, strict=True)):
        np.testing.assert_array_equal(rows, other, err_msg=f"bank {bank}")
    for name, value in vars(a).items():
        if name == "detectors":
            continue
        other = getattr(b, name)
        assert value.shape == other.shape, name
        if value.dtype == object:
            assert value.tolist() == other.tolist(), name
        else:
            np.testing.assert_array_equal(value, other, err_msg=name)


def test_a_table_round_trips_through_bytes_and_take_keeps_each_device_whole() -> None:
    harness, ids = _filled()
    table = harness.store.load_many(ids)
    assert harness.store.found.all()
    assert len(table.episodes) == 1 and table.ids[table.episode_device[0]] == "th-1"  # the spike's open alert
    for compress in (True, False):
        _same(DeviceTable.from_bytes(table.to_bytes(compress), [d.shape[1] for d in table.detectors]), table)
    assert len(table.to_bytes()) < len(table.to_bytes(compress=False)) / 2
    reordered = table.take(np.array([3, 1, 4, 0, 2]))
    assert reordered.ids.tolist() == ["th-3", "th-1", "th-4", "th-0", "th-2"]
    for d in range(len(table)):
        _same(reordered.take(np.array([reordered.ids.tolist().index(table.ids[d])])), table.take(np.array([d])))
    assert (np.diff(reordered.metric_device) >= 0).all() and (np.diff(reordered.bucket_device) >= 0).all()
    _same(DeviceTable.concat([table.take(np.arange(2)), table.take(np.arange(2, 5))]), table)
    _same(table.slice(1, 4), table.take(np.arange(1, 4)))


def test_the_store_adds_new_devices_keeps_the_rest_of_a_shard_and_drops_expired_ones() -> None:
    store = ShardedStore(DictMapState(), shards=2, ttl_ms=1_000, seq_words=64, state_sizes=[3], tokens=DictValueState())
    table = store.load_many(["a", "b", "c"])
    assert not store.found.any() and table.core[:, LAST_WALL_MS].tolist() == [0, 0, 0]
    table.core[:, LAST_WALL_MS] = 100
    table.core[:, RECEIVED] = [1, 2, 3]
    store.save_many(table, now_ms=100)
    again = store.load_many(["c", "d"])
    assert store.found.tolist() == [True, False] and again.core[:, RECEIVED].tolist() == [3, 0]
    again.core[:, LAST_WALL_MS] = 2_000
    again.core[1, RECEIVED] = 1  # d sent a record this batch
    store.save_many(again, now_ms=2_000)  # a and b (last heard at 100) are past the TTL if in a rewritten shard
    left = {d for d in "abcd" if store.load(d) is not None}
    rewritten = set(store.shard_of(["c", "d"]).tolist())
    assert left == {"c", "d"} | {d for d in "ab" if int(store.shard_of([d])[0]) not in rewritten}
    store.load_many(["c", "e"])  # e asked for (say, by the silence timer) but never heard from
    store.save_many(store.load_many(["c", "e"]), now_ms=2_000)
    assert store.load("e") is None and store.load("c") is not None


def test_the_shard_cache_answers_only_for_the_token_it_was_written_with(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache")
    assert cache.get("0-1", 7) is None
    cache.put("0-1", 7, b"shard")
    assert cache.get("0-1", 7) == b"shard" and cache.get("0-1", 8) is None and cache.get("1-1", 7) is None
    cache.put("0-1", 8, b"newer")
    assert cache.get("0-1", 7) is None and cache.get("0-1", 8) == b"newer"
    (tmp_path / "cache" / "0-1").write_bytes(b"\x08")  # a file cut short reads as no copy
    assert cache.get("0-1", 8) is None
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["0-1"]  # no partial files left


def test_shard_reads_come_from_the_cache_only_while_the_state_store_names_that_copy(tmp_path: Path) -> None:
    """The state store stays the truth: a rolled-back version, another executor's write or a
    copy from another partition never serves a read."""
    ids = [f"dev-{i}" for i in range(40)]
    state, tokens = DictMapState(), DictValueState()

    def executor(name: str, partition: int = 0) -> ShardedStore:
        # (a partition's state and tokens are its own: partition 1 has none yet)
        own_state, own_tokens = (state, tokens) if partition == 0 else (DictMapState(), DictValueState())
        store = ShardedStore(
            own_state, shards=4, ttl_ms=10**12, seq_words=64, state_sizes=[3], tokens=own_tokens, shard_devices=10
        )
        store.serve(partition, ShardCache(tmp_path / name))
        return store

    def batch(store: ShardedStore, received: int) -> dict[str, int]:
        """One micro-batch touching every device; what its read came from."""
        table = store.load_many(ids)
        seen = table.core[:, RECEIVED].tolist()
        table.core[:, RECEIVED] = received
        store.save_many(table, now_ms=0)
        return {**store.read, "received_before": seen[0] if len(set(seen)) == 1 else -1}

    one = executor("one")
    assert batch(one, 1) == {"state_shards_read": 1, "state_shards_cached": 0, "received_before": 0}  # then 4
    assert batch(one, 2) == {"state_shards_read": 4, "state_shards_cached": 4, "received_before": 1}
    version_2 = (dict(state.values), tokens.value)
    assert batch(one, 3)["state_shards_cached"] == 4  # the cache now holds version 3
    state.values, tokens.value = dict(version_2[0]), version_2[1]  # version 3's task failed: rolled back
    assert batch(one, 4) == {"state_shards_read": 4, "state_shards_cached": 0, "received_before": 2}
    assert batch(executor("two"), 5)["state_shards_cached"] == 0  # another executor's cache is empty...
    assert batch(one, 6) == {"state_shards_read": 4, "state_shards_cached": 0, "received_before": 5}  # ...and wins
    assert batch(executor("one", partition=1), 7)["state_shards_cached"] == 0  # the same cache, another partition
    no_cache = ShardedStore(state, shards=4, ttl_ms=10**12, seq_words=64, state_sizes=[3], tokens=tokens)
    assert batch(no_cache, 8) == {"state_shards_read": 4, "state_shards_cached": 0, "received_before": 6}


def test_shards_without_shard_tokens_are_refused_not_read_as_one() -> None:
    """A layout older than shard tokens: reading it as one shard would start its other
    shards' devices afresh without a word."""
    state = DictMapState()
    state.updateValue((0,), (b"a",))
    state.updateValue((1,), (b"b",))
    store = ShardedStore(state, shards=4, ttl_ms=10**12, seq_words=64, state_sizes=[3], tokens=DictValueState())
    with pytest.raises(ValueError, match="without shard tokens"):
        store.load_many(["dev-1"])


def test_a_table_of_fewer_detector_banks_reads_with_the_new_banks_empty() -> None:
    """A detector added for a device type adds a bank: state written without it loads, the
    new bank empty."""
    harness, ids = _filled(3, StreamSettings(device_detector="episode_likelihood"))
    table = harness.store.load_many(ids)
    blob = table.to_bytes()
    wider = DeviceTable.from_bytes(blob, [*harness.engine.state_sizes, 7])
    assert len(wider.detectors) == 2 and wider.detectors[1].shape == (0, 7)
    np.testing.assert_array_equal(wider.detectors[0], table.detectors[0])


def test_processing_through_a_store_of_many_shards_matches_one_shard() -> None:
    """Shard count is a storage detail: the same records give the same outputs."""
    rng = random.Random(5)
    series = [
        record(i, device=f"th-{d}", offset=i * 4 + d, temperature=21 + rng.gauss(0, 0.2) + (9 if i == 200 + d else 0))
        for i in range(300)
        for d in range(4)
    ]
    outputs = []
    for shards in (1, 7):
        harness = Harness()
        harness.store = MemoryStore(
            harness.engine.state_sizes, harness.engine.seq_words, shards=shards, shard_devices=1
        )
        rows = [row for start in range(0, len(series), 200) for row in harness.process(series[start : start + 200])]
        outputs.append(_comparable(rows))
    assert outputs[0] == outputs[1]
    assert sum(1 for row in outputs[0] if row[0] == "alert") >= 4


class CountingMapState(DictMapState):
    """A ``MapState`` that counts its writes (each one a round trip to the JVM in the job)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        self.writes += 1
        super().updateValue(key, value)


def _touch(store: ShardedStore, ids: list[str], now_ms: int = 0) -> list[int]:
    """One micro-batch of every device in ``ids``: their ``RECEIVED`` before it."""
    table = store.load_many(ids)
    seen = table.core[:, RECEIVED].tolist()
    table.core[:, RECEIVED] += 1
    table.core[:, LAST_WALL_MS] = now_ms
    store.save_many(table, now_ms=now_ms)
    return seen


def test_a_partition_has_as_many_shards_as_its_devices_need_and_keeps_every_device_when_they_grow() -> None:
    state, tokens = CountingMapState(), DictValueState()
    store = ShardedStore(state, shards=8, ttl_ms=10**12, seq_words=64, state_sizes=[3], tokens=tokens, shard_devices=10)
    few = [f"dev-{i}" for i in range(10)]
    assert _touch(store, few) == [0] * 10
    assert (store.live, state.writes, len(tokens.value[0]) // 8) == (1, 1, 1)  # one write a batch, not eight
    more = few + [f"dev-{i}" for i in range(10, 35)]
    assert _touch(store, more[10:]) == [0] * 25  # 35 devices: regrouped into 4 shards
    assert store.live == 4 and sorted(key for (key,) in state.values) == [0, 1, 2, 3]
    assert _touch(store, more) == [1] * 35  # every device found where the new count puts it
    again = ShardedStore(state, shards=8, ttl_ms=10**12, seq_words=64, state_sizes=[3], tokens=tokens, shard_devices=10)
    assert _touch(again, more) == [2] * 35 and again.live == 4  # the count is the partition's, in its tokens
    crowd = [f"dev-{i}" for i in range(200)]
    assert _touch(again, crowd)[:35] == [3] * 35 and again.live == 8  # at most ``shards``
