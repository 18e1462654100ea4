"""Everything the job does to one Kafka partition's records of a micro-batch, on columns,
without Spark: the job's hot path, a few microseconds a reading, and results independent of
how the stream is cut into micro-batches (docs/streaming-internals.md, "The engine").
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np

from iotwatch.contract.detection import Rule
from iotwatch.contract.telemetry import GOODBYE_EVENT
from iotwatch.settings import StreamSettings
from iotwatch.streaming import rules
from iotwatch.streaming.aggregates import close_buckets, flush_buckets
from iotwatch.streaming.alert_rules import AlertRules
from iotwatch.streaming.detector_plan import DetectorPlan
from iotwatch.streaming.device_state import LAST_APPEND_MS, MAX_EVENT_MS
from iotwatch.streaming.episode_book import EpisodeBook
from iotwatch.streaming.fleet_scoring import FleetLookup, fleet_scores
from iotwatch.streaming.partition_io import BatchOutput, DeviceStore, RecordColumns, empty_readings
from iotwatch.streaming.reading_frame import reading_frame
from iotwatch.streaming.scored_readings import DeviceScorer
from iotwatch.streaming.sorted_batch import SortedBatch, dead_letters, sequence

__all__ = ["BatchOutput", "DeviceStore", "FleetLookup", "PartitionEngine", "RecordColumns"]


class PartitionEngine:
    """The per-partition step, configured once per job from the stream settings."""

    def __init__(
        self, settings: StreamSettings, model_version: str | None = None, fleet_models: FleetLookup | None = None
    ) -> None:
        self.settings = settings
        self.fleet_models = fleet_models
        self.detector_name = settings.device_detector
        specs = rules.rule_specs(settings, self.detector_name)
        self.plan = DetectorPlan.from_settings(settings, specs[Rule.ANOMALY_SCORE])
        self.scorer = DeviceScorer(self.plan)
        self.rules = AlertRules(settings, specs, tuple(bank.anomaly for bank in self.plan.banks))
        self.model_version = model_version or f"{self.detector_name}@online"
        self.lateness_ms = int(settings.allowed_lateness_s * 1000)
        self.bucket_ms = settings.aggregate_interval_s * 1000
        self.bucket_grace_ms = min(self.lateness_ms, 10_000)
        self.window = -(-settings.dedup_window // 64) * 64
        self.seq_words = self.window // 64

    @property
    def state_sizes(self) -> list[int]:
        """The row width of each detector bank (the state store's detector arrays)."""
        return self.plan.state_sizes

    def process(
        self, store: DeviceStore, records: RecordColumns, now_ms: int | None = None, event_clock_ms: int = 0
    ) -> BatchOutput:
        """Handle one partition's records of a micro-batch; device state is read from and
        written back to ``store``; ``event_clock_ms``: the newest event time of the
        partition's earlier batches (0: unknown), which tells a device's silence in the log
        from a gap of the whole input (:meth:`AlertRules.raise_and_clear`)."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        batch, table = SortedBatch.sort(records, store)
        sequenced = sequence(batch, table, self.window, self.lateness_ms, now_ms)
        readings = self.scorer.score(batch, sequenced, table)
        book = EpisodeBook(table, batch.devices, self.model_version)
        fleet = fleet_scores(self.fleet_models, readings, table, self.rules.specs[Rule.FLEET_ANOMALY].fire)
        alerts = self.rules.raise_and_clear(batch, sequenced, readings, book, fleet, event_clock_ms)
        newest = sequenced.newest[sequenced.scored]
        aggregates = close_buckets(table, readings, newest, self.bucket_ms, self.bucket_grace_ms)
        frame = reading_frame(batch, sequenced.scored, table.site, readings)
        book.write_back()
        store.save_many(table, now_ms)
        return BatchOutput(
            frame,
            alerts,
            aggregates,
            dead_letters(batch, sequenced, table, self.lateness_ms),
            batch.devices.tolist(),
            sequenced.counters,
            heard_append_ms=table.core[:, LAST_APPEND_MS].copy(),
            heard_event_ms=table.core[:, MAX_EVENT_MS].copy(),
            goodbyes=goodbyes(batch),
        )

    def silence(self, store: DeviceStore, device_ids: Iterable[str], now_ms: int) -> BatchOutput:
        """No data from these devices for the silence timeout (the job's processing-time
        timer): raise ``device_silent`` and flush their open aggregate buckets."""
        device_ids = list(device_ids)
        table = store.load_many(device_ids)
        book = EpisodeBook(table, device_ids, self.model_version)
        alerts = self.rules.silence_timer(table, store.found, book, now_ms)
        book.write_back()
        aggregates = flush_buckets(table)
        store.save_many(table, now_ms)
        return BatchOutput(empty_readings(), alerts, aggregates, [], device_ids, {})


def goodbyes(batch: SortedBatch) -> list[str]:
    """Devices whose last valid record of the batch (in Kafka order) is a goodbye
    (:data:`iotwatch.contract.telemetry.GOODBYE_EVENT`)."""
    valid = np.flatnonzero(batch.valid & (batch.codes >= 0))
    if not len(valid):
        return []
    codes = batch.codes[valid]
    last = valid[np.r_[codes[1:] != codes[:-1], True]]  # positions are in (device, Kafka order)
    said = last[batch.event[last] == GOODBYE_EVENT]
    return [str(d) for d in batch.devices[batch.codes[said]].tolist()]
