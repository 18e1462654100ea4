"""The Spark side of the per-partition logic: ``transformWithStateInPandas`` glue.

The stateful operator is keyed by Kafka partition (salted to spread the partitions over its
tasks: :mod:`iotwatch.streaming.operator_key`): every record of a device is in its
device's partition (the gateway keys by ``device_id``), so one call handles all of a
partition's records of a micro-batch at once, on columns (:mod:`iotwatch.streaming.engine`), and
writes what comes out -- alerts, dead letters, aggregates, the archive -- itself
(:mod:`iotwatch.streaming.sinks`); it emits only one tally row of counters per call.
Per-device state lives in the RocksDB state store, as columnar shards per partition
(:class:`iotwatch.streaming.state_store.ShardedStore`: one state-store call per shard, not per
device; devices gone for good are dropped after the state TTL); a small per-partition roster says
when each device was last heard of, and one processing-time timer per partition fires
when the next device is due to be reported silent. (Adding partitions to the raw topic
moves devices between partitions, and their state with them is lost: as with Kafka
Streams, repartitioning means reprocessing -- ``iotwatch replay``.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from iotwatch.contract.telemetry import DecodedBatch, decode_batch
from iotwatch.settings import Settings
from iotwatch.streaming.operator_key import partition_of
from iotwatch.streaming.schemas import (
    DEVICE_SHARD_SCHEMA,
    ROSTER_SCHEMA,
    SHARD_TOKENS_SCHEMA,
    TALLY_FIELDS,
    TALLY_SCHEMA,
)

if TYPE_CHECKING:
    from iotwatch.streaming.engine import PartitionEngine
    from iotwatch.streaming.partition_io import RecordColumns
    from iotwatch.streaming.shard_cache import ShardCache

_SEP = "\x1f"


class Roster:
    """The devices of one partition with the wall time each was last heard of, and whether
    its silence has been reported: what the silence timer needs, without reading every
    device's full state."""

    def __init__(self, devices: list[str], last_wall_ms: np.ndarray, silent: np.ndarray, timer_ms: int) -> None:
        self.devices, self.last_wall_ms, self.silent, self.timer_ms = devices, last_wall_ms, silent, timer_ms

    @classmethod
    def load(cls, value: tuple[Any, ...] | None) -> Roster:
        if value is None:
            return cls([], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool), 0)
        devices, last, silent, timer_ms = value
        return cls(
            devices.split(_SEP) if devices else [],
            np.frombuffer(last, dtype=np.int64).copy(),
            np.frombuffer(silent, dtype=np.bool_).copy(),
            int(timer_ms),
        )

    def to_value(self) -> tuple[Any, ...]:
        return (_SEP.join(self.devices), self.last_wall_ms.tobytes(), self.silent.tobytes(), self.timer_ms)

    def heard(self, devices: list[str], now_ms: int) -> None:
        rows = pd.Index(self.devices).get_indexer(devices) if self.devices else np.full(len(devices), -1)
        new = np.flatnonzero(rows < 0)
        if len(new):
            rows[new] = len(self.devices) + np.arange(len(new))
            self.devices = self.devices + [devices[i] for i in new.tolist()]
            self.last_wall_ms = np.concatenate([self.last_wall_ms, np.zeros(len(new), dtype=np.int64)])
            self.silent = np.concatenate([self.silent, np.zeros(len(new), dtype=bool)])
        self.last_wall_ms[rows] = now_ms
        self.silent[rows] = False

    def due(self, now_ms: int, timeout_ms: int) -> list[str]:
        """Devices silent for the timeout whose silence was not reported yet (now marked)."""
        rows = np.flatnonzero(~self.silent & (self.last_wall_ms + timeout_ms <= now_ms))
        self.silent[rows] = True
        return [self.devices[i] for i in rows.tolist()]

    def forget(self, now_ms: int, ttl_ms: int) -> None:
        """Drop devices whose state the store's TTL has dropped too."""
        keep = self.last_wall_ms + ttl_ms > now_ms
        if not keep.all():
            self.devices = [d for d, k in zip(self.devices, keep.tolist(), strict=True) if k]
            self.last_wall_ms, self.silent = self.last_wall_ms[keep], self.silent[keep]

    def next_due_ms(self, timeout_ms: int) -> int:
        waiting = self.last_wall_ms[~self.silent]
        return int(waiting.min()) + timeout_ms if len(waiting) else 0


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
    columns = {
        "kafka_partition": np.array([partition], dtype=np.int32),
        **{name: np.array([int(counts.get(name, 0))], dtype=np.int64) for name in TALLY_FIELDS},
    }
    return pd.DataFrame(columns, columns=TALLY_SCHEMA.names)


def unpack(frames: Iterator[pd.DataFrame], partition: int) -> RecordColumns:
    """Packed rows (``iotwatch.streaming.schemas.PACKED_SCHEMA``) back into one partition's columns."""
    from iotwatch.streaming.partition_io import RecordColumns

    chunks = sorted((row for frame in frames for row in frame.itertuples(index=False)), key=lambda r: r.first_offset)
    if not chunks:
        empty = np.zeros(0, dtype=np.int64)
        return RecordColumns(
            partition, empty, empty, np.zeros(0, dtype=object), np.zeros(0, dtype=object), decode_batch([])
        )
    cat = lambda name, dtype=None: np.concatenate([np.asarray(getattr(c, name), dtype=dtype) for c in chunks])  # noqa: E731
    sizes = np.array([len(c.offset) for c in chunks], dtype=np.int64)
    row_base = np.repeat(np.concatenate([[0], np.cumsum(sizes)[:-1]]), [len(c.metric_row) for c in chunks])
    decoded = DecodedBatch(
        reason=cat("reason", object),
        detail=cat("detail", object),
        device_id=cat("device_id", object),
        device_type=cat("device_type", object),
        site=cat("site", object),
        event=cat("event", object),
        seq=cat("seq", np.int64),
        ts=cat("ts", np.int64),
        metric_row=cat("metric_row", np.int64) + row_base.astype(np.int64),
        metric_name=cat("metric_name", object),
        metric_value=cat("metric_value", np.float64),
    )
    return RecordColumns(
        partition, cat("offset", np.int64), cat("append_ms", np.int64), cat("key", object), cat("raw", object), decoded
    )


class PartitionProcessor(StatefulProcessor):
    """Keyed by Kafka partition; see :class:`iotwatch.streaming.engine.PartitionEngine`."""

    def __init__(self, settings: Settings, archive_dir: str) -> None:
        self.all_settings = settings  # the fleet-model watcher needs Kafka and registry settings
        self.settings = settings.stream
        self.archive_dir = archive_dir

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state variables. Spark also runs ``init`` on the driver, when it plans the
        first micro-batch, only to learn their schemas: what the handlers need (compiled kernels,
        Kafka producers, the fleet-model watcher) is made on first use, in :meth:`_serve`."""
        self.handle = handle
        # no state-store TTL: ShardedStore drops devices silent past the TTL when it rewrites a shard
        self.shard_state = handle.getMapState("device_shards", "shard int", DEVICE_SHARD_SCHEMA)
        self.shard_tokens = handle.getValueState("shard_tokens", SHARD_TOKENS_SCHEMA)
        self.roster = handle.getValueState("roster", ROSTER_SCHEMA)
        self.timeout_ms = int(self.settings.silence_timeout_s * 1000)
        self.ttl_ms = int(self.settings.state_ttl_s * 1000)
        self.cache: ShardCache | None = None
        self.engine: PartitionEngine | None = None

    def _start(self) -> PartitionEngine:
        """The engine, sinks, archive writer and device store of this task. (Imported here, not at
        the top: the driver imports this module to run ``init``, in a fresh Python process,
        while it plans the first micro-batch.)"""
        from iotwatch.heap import freeze_startup_heap
        from iotwatch.models.kernels import kernel_for
        from iotwatch.streaming import sequencing
        from iotwatch.streaming.engine import PartitionEngine
        from iotwatch.streaming.fleet_models import fleet_lookup
        from iotwatch.streaming.shard_cache import ShardCache
        from iotwatch.streaming.sinks.archive import ArchiveWriter
        from iotwatch.streaming.sinks.events import EventSinks
        from iotwatch.streaming.state_store import ShardedStore

        kernel_for(self.settings.device_detector).warm()
        sequencing.warm()
        freeze_startup_heap()
        engine = PartitionEngine(self.settings, fleet_models=fleet_lookup(self.all_settings))
        self.sinks = EventSinks(self.all_settings)
        self.archive = ArchiveWriter(self.archive_dir, self.settings.device_detector)
        self.devices = ShardedStore(
            self.shard_state,
            self.settings.state_shards,
            self.ttl_ms,
            engine.seq_words,
            engine.kernel.STATE_SIZE,
            self.shard_tokens,
        )
        if self.settings.shard_cache:
            self.cache = ShardCache.on_worker()
        self.engine = engine
        return engine

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        clock = StepClock()
        partition, engine = self._serve(key)
        records = unpack(rows, partition)
        clock.lap("ms_unpack")
        out = engine.process(self.devices, records, now_ms)
        clock.lap("ms_engine")
        tally = {**out.counters, **self.sinks.write(out), **self.devices.written, **self.devices.read}
        clock.lap("ms_sinks")
        if len(records.offset):
            tally["archive_files"] = self.archive.write(
                out.readings, partition, int(records.offset.min()), int(records.offset.max())
            )
        clock.lap("ms_archive")
        roster = Roster.load(self.roster.get() if self.roster.exists() else None)
        roster.heard(out.devices, now_ms)
        for name, count in self._report_silence(engine, roster, now_ms).items():
            tally[name] = tally.get(name, 0) + count
        clock.lap("ms_roster")
        yield tally_row(partition, {**tally, **clock.steps})

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        if not self.roster.exists():
            return
        partition, engine = self._serve(key)
        roster = Roster.load(self.roster.get())
        roster.timer_ms = 0  # this one fired
        tally = self._report_silence(engine, roster, timerValues.getCurrentProcessingTimeInMs())
        if tally:
            yield tally_row(partition, tally)

    def _serve(self, key: Any) -> tuple[int, PartitionEngine]:
        """The key's Kafka partition, which the device store now serves, and the engine."""
        engine = self.engine or self._start()
        partition = partition_of(key)
        self.devices.serve(partition, self.cache)
        return partition, engine

    def _report_silence(self, engine: PartitionEngine, roster: Roster, now_ms: int) -> dict[str, int]:
        """Raise ``device_silent`` for devices due, keep the roster and re-arm the timer."""
        counts: dict[str, int] = {}
        due = roster.due(now_ms, self.timeout_ms)
        if due:
            counts = self.sinks.write(engine.silence(self.devices, due, now_ms))
        roster.forget(now_ms, self.ttl_ms)
        # The timer is re-armed only to fire earlier: one that fires before anyone is due
        # finds nobody and re-arms for the next. (Moving it later on every batch, as devices
        # keep reporting, cost a timer delete and register per partition and batch, and the
        # state server's set-up of the timer state for each task.)
        next_ms = roster.next_due_ms(self.timeout_ms)
        if next_ms and (not roster.timer_ms or next_ms < roster.timer_ms):
            if roster.timer_ms:
                self.handle.deleteTimer(roster.timer_ms)
            self.handle.registerTimer(next_ms)
            roster.timer_ms = next_ms
        self.roster.update(roster.to_value())
        return counts

    def close(self) -> None:
        pass
