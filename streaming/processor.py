"""The Spark side of the per-partition logic: ``transformWithStateInPandas`` glue, one call per
Kafka partition and micro-batch (docs/streaming-internals.md, "The stateful operator").

Spark also unpickles the processor on the driver and runs :meth:`PartitionProcessor.init` only
to learn the state schemas, and the first alerts wait for it: so this module imports no more
than ``init`` needs, and the handlers import what they use when they first run.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from iotwatch.streaming.operator_key import partition_of
from iotwatch.streaming.schemas import DEVICE_SHARD_SCHEMA, ROSTER_SCHEMA, SHARD_KEY_SCHEMA, SHARD_TOKENS_SCHEMA

if TYPE_CHECKING:
    import pandas as pd

    from iotwatch.settings import Settings, StreamSettings
    from iotwatch.streaming.engine import PartitionEngine
    from iotwatch.streaming.roster import Roster
    from iotwatch.streaming.shard_cache import ShardCache


def import_handlers() -> None:
    """Import what the handlers and :meth:`PartitionProcessor._start` use: a worker that runs
    this before its first batch (``iotwatch.streaming.job.warm_python_workers``) spends none
    of that batch on imports."""
    from iotwatch.streaming import engine, fleet_models, operator_rows, roster, shard_cache, state_store  # noqa: F401
    from iotwatch.streaming.sinks import archive, events  # noqa: F401


class PartitionProcessor(StatefulProcessor):
    """Keyed by Kafka partition; see :class:`iotwatch.streaming.engine.PartitionEngine`."""

    def __init__(self, settings: Settings, archive_dir: str) -> None:
        self.archive_dir = archive_dir
        self.timeout_ms = int(settings.stream.silence_timeout_s * 1000)
        self.ttl_ms = int(settings.stream.state_ttl_s * 1000)
        # the fleet-model watcher needs Kafka and registry settings too: all of them, pickled
        self._pickled_settings = pickle.dumps(settings)

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state variables. Spark also runs ``init`` on the driver, when it plans the
        first micro-batch, only to learn their schemas: what the handlers need (compiled kernels,
        Kafka producers, the fleet-model watcher) is made on first use, in :meth:`_start`."""
        self.handle = handle
        # no state-store TTL: ShardedStore drops devices silent past the TTL when it rewrites a shard
        self.shard_state = handle.getMapState("device_shards", SHARD_KEY_SCHEMA, DEVICE_SHARD_SCHEMA)
        self.shard_tokens = handle.getValueState("shard_tokens", SHARD_TOKENS_SCHEMA)
        self.roster = handle.getValueState("roster", ROSTER_SCHEMA)
        self.cache: ShardCache | None = None
        self.engine: PartitionEngine | None = None

    def _start(self) -> PartitionEngine:
        """The settings, engine, sinks, archive writer and device store of this task."""
        from iotwatch.heap import freeze_startup_heap
        from iotwatch.models.catalog import warm
        from iotwatch.streaming import sequencing
        from iotwatch.streaming.engine import PartitionEngine
        from iotwatch.streaming.fleet_models import fleet_lookup
        from iotwatch.streaming.shard_cache import ShardCache
        from iotwatch.streaming.sinks.archive import ArchiveWriter
        from iotwatch.streaming.sinks.events import EventSinks
        from iotwatch.streaming.state_store import ShardedStore

        self.all_settings: Settings = pickle.loads(self._pickled_settings)
        self.settings: StreamSettings = self.all_settings.stream
        for detector in self.settings.detector_names():
            warm(detector)
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
            engine.state_sizes,
            self.shard_tokens,
        )
        if self.settings.shard_cache:
            self.cache = ShardCache.on_worker()
        self.engine = engine
        return engine

    def handleInputRows(  # type: ignore[override]  # transformWithStateInPandas passes pandas frames only
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        from iotwatch.streaming.operator_rows import StepClock, tally_row, unpack
        from iotwatch.streaming.roster import Roster

        now_ms = timerValues.getCurrentProcessingTimeInMs()
        clock = StepClock()
        partition, engine = self._serve(key)
        records = unpack(rows, partition)
        clock.lap("ms_unpack")
        roster = Roster.load(self.roster.get())  # (None when absent: no exists() round trip first)
        out = engine.process(self.devices, records, now_ms, event_clock_ms=roster.event_ms)
        clock.lap("ms_engine")
        tally = {**out.counters, **self.sinks.write(out), **self.devices.written, **self.devices.read}
        clock.lap("ms_sinks")
        if len(records.offset):
            tally["archive_files"] = self.archive.write(
                out.readings, partition, int(records.offset.min()), int(records.offset.max())
            )
        clock.lap("ms_archive")
        roster.heard(out.devices, now_ms, out.heard_append_ms, out.heard_event_ms)
        roster.said_goodbye(out.goodbyes)
        tally["goodbyes"] = len(out.goodbyes)
        for name, count in self._report_silence(engine, roster, now_ms).items():
            tally[name] = tally.get(name, 0) + count
        clock.lap("ms_roster")
        yield tally_row(partition, {**tally, **clock.steps})

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        from iotwatch.streaming.operator_rows import tally_row
        from iotwatch.streaming.roster import Roster

        value = self.roster.get()
        if value is None:
            return
        partition, engine = self._serve(key)
        roster = Roster.load(value)
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
        """Raise ``device_silent`` for devices due (silent while the partition's records moved
        on: :class:`iotwatch.streaming.roster.Roster`), keep the roster and re-arm the timer."""
        counts: dict[str, int] = {}
        due = roster.due(now_ms, self.timeout_ms)
        if due:
            counts = self.sinks.write(engine.silence(self.devices, due, now_ms))
        counts["silence_held"] = roster.held(now_ms, self.timeout_ms)
        counts["devices_reporting"] = roster.reporting()
        roster.forget(now_ms, self.ttl_ms)
        # The timer is re-armed only to fire earlier: one that fires before anyone is due
        # finds nobody and re-arms for the next. (Moving it later on every batch, as devices
        # keep reporting, cost a timer delete and register per partition and batch, and the
        # state server's set-up of the timer state for each task.)
        next_ms = roster.next_due_ms(self.timeout_ms, now_ms)
        if next_ms and (not roster.timer_ms or next_ms < roster.timer_ms):
            if roster.timer_ms:
                self.handle.deleteTimer(roster.timer_ms)
            self.handle.registerTimer(next_ms)
            roster.timer_ms = next_ms
        self.roster.update(roster.to_value())
        return counts

    def close(self) -> None:
        pass
