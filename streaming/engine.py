"""Everything the job does to one Kafka partition's records of a micro-batch, on columns.

This is the speed layer's hot path, without Spark (testable on plain arrays): the Spark
side (:mod:`streaming.processor`) hands it the decoded records of one partition and a
store of per-device state, and writes what it returns. Per micro-batch it costs a few
microseconds per reading, because every step works on whole columns:

1. sequence bookkeeping of every record (:func:`streaming.sequencing.classify`, compiled):
   dead letters, duplicates, late records, clock steps, counter resets;
2. cleaning of the readings' metrics (:func:`streaming.cleaning.clean_entries`): units,
   derived metrics, physical ranges;
3. every scored metric through the per-(device, metric) detector's compiled kernel
   (``device_detector``'s, :func:`models.kernels.kernel_for`) in one call;
4. rule scores per reading (:func:`streaming.rules.rule_scores`), then the alert lifecycle
   (:func:`streaming.alerting.advance`) only where a rule fires or an alert is open;
5. fleet-model scores per device type, event-time aggregates, and the output frame: one
   row per reading, plus alerts, aggregates, dead letters and one tally row.

Records of a device are handled in the order Kafka appended them, which makes every result
independent of how the stream is cut into micro-batches: a restart from a checkpoint, or a
replay, reproduces the same scores and alert ids.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import numpy as np
import pandas as pd

from iotwatch.contract.alerts import AlertRecord, encode_alert, iso_time
from iotwatch.contract.metric_catalog import KNOWN_METRICS
from iotwatch.contract.telemetry import DecodedBatch, decode_batch
from iotwatch.settings import StreamSettings
from models.base import Detector
from models.catalog import make
from models.kernels import kernel_for
from streaming import rules
from streaming.alerting import AlertContext, DeviceIdentity, Episode, Observation, RuleSpec, advance, alert_id
from streaming.cleaning import clean_entries, entry_column, scored_names
from streaming.coupling import explained_entries
from streaming.device_state import (
    BUCKET_FIELDS,
    CORE_FIELDS,
    COUNTERS,
    EP_ABOVE,
    EP_BELOW,
    EP_LAST_MS,
    EP_METRIC,
    EP_OCCURRENCES,
    EP_RULE,
    EP_START_MS,
    EP_START_SEQ,
    EP_STATUS,
    EPISODE_FIELDS,
    IDLE,
    LAST_WALL_MS,
    MAX_EVENT_MS,
    OPEN,
    PENDING,
    SEQ_HIGH,
)
from streaming.device_table import DeviceTable
from streaming.schemas import AGGREGATE_STATS, READING_COLUMNS, SCORED_METRICS, WIDE_METRICS, score_column, value_column
from streaming.sequencing import INVALID, LATE_RECORD, OUT_OF_ORDER, SCORED_RECORD, classify

#: Describes reading ``i`` for an alert record; the metric is the one an open alert was raised on.
Describe = Callable[[int, str | None], Observation]

_WIDE_INDEX = {m: i for i, m in enumerate(WIDE_METRICS)}
_SCORED_INDEX = {m: i for i, m in enumerate(SCORED_METRICS)}
#: Columns of the aggregates (one row per device, metric and closed event-time bucket).
AGGREGATE_COLUMNS = ("device_id", "device_type", "site", "metric", "event_ms", *AGGREGATE_STATS)

#: Rules in the order their alerts are listed for one reading; a rule's position is its code
#: in the saved episodes (``EP_RULE``), so new rules go at the end.
RULE_ORDER = (
    rules.OUT_OF_RANGE,
    rules.CRASH,
    rules.HARSH_BRAKING,
    rules.LEAK,
    rules.STUCK_HVAC,
    rules.ANOMALY,
    rules.SILENT,
    rules.FLEET,
    rules.COOLANT,
    rules.BATTERY,
    rules.HUMIDITY,
)
_RULE_INDEX = {name: i for i, name in enumerate(RULE_ORDER)}
#: The metrics that give a device's position; an alert raised on a reading that has them carries them.
_POSITION = frozenset({"lat_deg", "lon_deg"})
_STATUS = {IDLE: "idle", PENDING: "pending", OPEN: "open"}
_STATUS_CODE = {name: code for code, name in _STATUS.items()}

#: device type -> (model version label, fleet detector), or None when no model is approved.
FleetLookup = Callable[[str], "tuple[str, Detector] | None"]


@dataclass
class RecordColumns:
    """One Kafka partition's records of a micro-batch, decoded, in offset order."""

    partition: int
    offset: np.ndarray  # int64
    append_ms: np.ndarray  # int64 Kafka timestamp (0: none)
    key: np.ndarray  # object: the Kafka key as text, or None
    raw: np.ndarray  # object: the original payload bytes
    decoded: DecodedBatch

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
    :mod:`streaming.state_store`). Devices are loaded and saved a batch at a time, as one
    :class:`DeviceTable` in the order asked for (devices not seen before as new rows);
    ``found`` says which were known."""

    found: np.ndarray

    def load_many(self, device_ids: list[str]) -> DeviceTable: ...

    def save_many(self, table: DeviceTable, now_ms: int) -> None: ...


@dataclass
class BatchOutput:
    """What one call emits: the scored readings (the archive's rows, in the wide layout of
    :data:`READING_COLUMNS`), the alert records, the closed aggregates, the dead letters
    (contract violations and late records, with reason and original bytes), the devices
    seen (for the silence timer) and the batch's counters."""

    readings: pd.DataFrame
    alerts: list[AlertRecord] = field(default_factory=list)
    aggregates: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(AGGREGATE_COLUMNS)))
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """Everything as dicts tagged with a ``kind`` (tests and small tools): readings
        with their ``metrics`` and ``scores`` as dicts, then alerts (the record as ``body``),
        aggregates, dead letters and a ``tally``."""
        rows = [
            {**r, "metrics": reading_metrics(r), "scores": reading_scores(r)} for r in self.readings.to_dict("records")
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
        rows += [{"kind": "aggregate", **r} for r in self.aggregates.to_dict("records")]
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


class _Readings:
    """Per-reading columns of the scored records, for the vectorised rules and messages."""

    def __init__(
        self,
        device_type: np.ndarray,
        event: np.ndarray,
        entry_reading: np.ndarray,
        names: np.ndarray,
        values: np.ndarray,
        out_of_range: np.ndarray,
        scores: np.ndarray,
    ) -> None:
        self.device_type = device_type
        self.event = event
        self.n = len(device_type)
        self.entry_reading = entry_reading
        self.names = names
        self.values = values
        self.entry_oor = out_of_range
        self.entry_scores = scores
        #: The scores the anomaly rule reads: the detectors' but those a coupling explains (0).
        self.alert_scores = scores
        self.out_of_range = np.bincount(entry_reading[out_of_range], minlength=self.n) > 0
        self.starts = np.searchsorted(entry_reading, np.arange(self.n + 1))
        self._by_name: dict[str, np.ndarray] = {}

    def metric(self, name: str) -> np.ndarray:
        column = self._by_name.get(name)
        if column is None:
            column = entry_column(self.n, self.entry_reading, self.names, self.values, name)
            self._by_name[name] = column
        return column

    def entries(self, i: int) -> range:
        return range(self.starts[i], self.starts[i + 1])

    def position(self, i: int) -> dict[str, float]:
        """The position reading ``i`` reported, if it reported one (vehicles): an alert raised
        on it carries it, so an emergency notification of a crash says where it happened."""
        return {self.names[k]: float(self.values[k]) for k in self.entries(i) if self.names[k] in _POSITION}

    def view(self, i: int) -> rules.ReadingView:
        """The scalar rules' view of reading ``i`` (messages of raised and cleared alerts)."""
        span = self.entries(i)
        metrics = {self.names[k]: float(self.values[k]) for k in span}
        oor = tuple(self.names[k] for k in span if self.entry_oor[k])
        event = self.event[i]
        return rules.ReadingView(self.device_type[i], metrics, event if isinstance(event, str) else None, oor)


class PartitionEngine:
    """The per-partition step, configured once per job from the stream settings."""

    def __init__(
        self, settings: StreamSettings, model_version: str | None = None, fleet_models: FleetLookup | None = None
    ) -> None:
        self.settings = settings
        self.fleet_models = fleet_models
        self.detector_name = settings.device_detector
        self.kernel = kernel_for(self.detector_name)
        reference = make(self.detector_name, **dict(settings.device_detector_params))
        self.params = self.kernel.params_vector(reference)
        self.initial_detector = self.kernel.initial_state(self.params)
        self.specs: dict[str, RuleSpec] = rules.rule_specs(settings, self.detector_name)
        self.model_version = model_version or f"{self.detector_name}@online"
        self.lateness_ms = int(settings.allowed_lateness_s * 1000)
        self.timeout_ms = int(settings.silence_timeout_s * 1000)
        self.bucket_ms = settings.aggregate_interval_s * 1000
        self.bucket_grace_ms = min(self.lateness_ms, 10_000)
        self.window = -(-settings.dedup_window // 64) * 64
        self.seq_words = self.window // 64

    # -- one micro-batch of one partition ------------------------------------------------------

    def process(self, store: DeviceStore, records: RecordColumns, now_ms: int | None = None) -> BatchOutput:
        """Handle one partition's records of a micro-batch; device state is read from and
        written back to ``store``."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        batch = _Batch.sort(records, self)
        batch.table = store.load_many(list(batch.devices))
        batch.adopt_identity()
        before = batch.classify(now_ms)
        readings, reading_frame = self._score(batch)
        alerts = self._alerts(batch, readings)
        aggregates = self._aggregates(batch, readings)
        counters = {
            name: int(v)
            for name, v in zip(CORE_FIELDS, (batch.core - before).sum(axis=0), strict=True)
            if name in COUNTERS
        }
        counters["no_device"] = int((batch.codes < 0).sum())
        batch.pack_episodes()
        store.save_many(batch.table, now_ms)
        return BatchOutput(reading_frame, alerts, aggregates, batch.dead_letters(), list(batch.devices), counters)

    # -- scores -----------------------------------------------------------------------------------

    def _score(self, batch: _Batch) -> tuple[_Readings, pd.DataFrame]:
        """Clean the scored records' metrics, run the detector kernel over every scored
        metric at once, and build one output row per reading."""
        decoded = batch.records.decoded
        reading_of = np.full(len(batch.records), -1, dtype=np.int64)
        reading_of[batch.order[batch.scored]] = np.arange(len(batch.scored))
        entry_reading = reading_of[decoded.metric_row]
        keep = entry_reading >= 0
        reading_device = batch.codes[batch.scored]
        reading_type = batch.table.device_type[reading_device] if len(reading_device) else np.zeros(0, dtype=object)
        er, names, values, oor = clean_entries(
            entry_reading[keep], decoded.metric_name[keep], decoded.metric_value[keep], reading_type
        )
        entry_device = reading_device[er]
        name_codes, name_list = pd.factorize(names)
        pair_codes, pair_keys = pd.factorize(entry_device.astype(np.int64) * max(len(name_list), 1) + name_codes)
        pair_device = (pair_keys // max(len(name_list), 1)).astype(np.int64)
        pair_name = (
            np.asarray(name_list, dtype=object)[pair_keys % max(len(name_list), 1)]
            if len(pair_keys)
            else np.zeros(0, dtype=object)
        )
        pair_row, pair_slot, pair_detector = batch.assign_slots(pair_device, pair_name, self.initial_detector)
        # A reading that arrives after a newer one of its device is archived and goes through
        # the rules, but the detectors neither learn from it nor score it: fed out of event
        # time order, a drifting or seasonal metric would look like a jump back.
        in_order = batch.in_order[er]
        scored = scored_names(names) & ~oor & in_order
        scores = np.full(len(names), np.nan)
        surprises = np.full(len(names), np.nan)
        ts = batch.seq_ts[1][batch.scored]
        if scored.any():
            stream = pair_detector[pair_codes[scored]]
            surprise = np.empty(int(scored.sum()))
            scores[scored] = self.kernel.score_learn_into(
                batch.table.detectors,
                stream.astype(np.int64),
                values[scored],
                ts[er[scored]].astype(np.int64),
                self.params,
                surprise,
            )
            surprises[scored] = surprise
        batch.remember_last(pair_row, pair_codes, values, ~oor & in_order)
        readings = _Readings(reading_type, batch.event[batch.scored], er, names, values, oor, scores)
        readings.device = reading_device
        readings.ts = ts
        readings.seq = batch.seq_ts[0][batch.scored]
        readings.in_order = batch.in_order
        readings.pair_slot = pair_slot[pair_codes] if len(pair_codes) else np.zeros(0, dtype=np.int64)
        spec = self.specs[rules.ANOMALY]
        explained = explained_entries(reading_type, er, names, surprises, moved=spec.clear, broken=spec.fire)
        readings.alert_scores = np.where(explained, 0.0, scores)
        anomaly = np.zeros(len(batch.scored))
        if scored.any():
            np.maximum.at(anomaly, er[scored], readings.alert_scores[scored])
        readings.anomaly = anomaly
        return readings, self._reading_frame(batch, readings)

    def _reading_frame(self, batch: _Batch, readings: _Readings) -> pd.DataFrame:
        """One row per reading in the wide layout: a column per catalogued metric and score
        (filled by scattering the entries, no per-row objects), extras only where present."""
        m = readings.n
        positions = batch.order[batch.scored]
        columns: dict[str, Any] = {
            "kind": np.full(m, "reading", dtype=object),
            "device_id": np.asarray(batch.devices, dtype=object)[readings.device] if m else np.zeros(0, dtype=object),
            "device_type": readings.device_type,
            "site": batch.table.site[readings.device],
            "seq": readings.seq.astype(np.int64),
            "event_ms": readings.ts.astype(np.int64),
            "kafka_partition": np.full(m, batch.records.partition, dtype=np.int32),
            "kafka_offset": batch.records.offset[positions].astype(np.int64),
            "body": np.full(m, None, dtype=object),
        }
        name_codes, names = pd.factorize(readings.names)
        wide_of = np.array([_WIDE_INDEX.get(n, -1) for n in names] + [-1], dtype=np.int64)[name_codes]
        scored_of = np.array([_SCORED_INDEX.get(n, -1) for n in names] + [-1], dtype=np.int64)[name_codes]
        values = np.full((len(WIDE_METRICS), m), np.nan)
        hit = wide_of >= 0
        values[wide_of[hit], readings.entry_reading[hit]] = readings.values[hit]
        scores = np.full((len(SCORED_METRICS), m), np.nan)
        hit = scored_of >= 0
        scores[scored_of[hit], readings.entry_reading[hit]] = readings.entry_scores[hit]
        columns.update((value_column(metric), values[i]) for i, metric in enumerate(WIDE_METRICS))
        columns.update((score_column(metric), scores[i]) for i, metric in enumerate(SCORED_METRICS))
        columns["out_of_range"] = _grouped(readings.entry_reading, readings.names, readings.entry_oor, m)
        extra = wide_of < 0
        columns["extra_names"] = _grouped(readings.entry_reading, readings.names, extra, m)
        columns["extra_values"] = _grouped(readings.entry_reading, readings.values, extra, m)
        columns["extra_scores"] = _grouped(readings.entry_reading, readings.entry_scores, extra, m)
        return pd.DataFrame(columns, columns=list(READING_COLUMNS))

    # -- alerts ------------------------------------------------------------------------------------

    def _alerts(self, batch: _Batch, readings: _Readings) -> list[AlertRecord]:
        """Rule scores of every reading, then the lifecycle of each (device, rule) that fires
        or has an alert open -- the only place that loops in Python, and only there."""
        found: list[tuple[tuple[int, int, int], AlertRecord]] = []
        scores = rules.rule_scores(readings, self.settings)
        scores[rules.ANOMALY] = (np.ones(readings.n, dtype=bool), readings.anomaly)
        describe: dict[str, Describe] = {rule: self._describe_rule(readings, rule) for rule in scores}
        describe[rules.ANOMALY] = self._describe_anomaly(readings)
        fleet = self._fleet_scores(batch, readings)
        if fleet is not None:
            scores[rules.FLEET], describe[rules.FLEET] = fleet
        bounds = np.searchsorted(readings.device, np.arange(len(batch.devices) + 1))
        for rule, (applies, score) in scores.items():
            spec = self.specs[rule]
            firing = applies & (score >= spec.fire)
            candidates = set(np.unique(readings.device[firing]).tolist()) | batch.open_devices(rule)
            for d in sorted(candidates):
                lo, hi = bounds[d], bounds[d + 1]
                idx = lo + np.flatnonzero(applies[lo:hi])
                found.extend(self._run_episode(batch, readings, d, rule, idx, score, firing, describe[rule]))
        found.extend(self._silence_in_log(batch, readings))
        found.sort(key=lambda item: item[0])
        return [alert for _, alert in found]

    def _run_episode(
        self,
        batch: _Batch,
        readings: _Readings,
        d: int,
        rule: str,
        idx: np.ndarray,
        score: np.ndarray,
        firing: np.ndarray,
        describe: Describe,
    ) -> list[tuple[tuple[int, int, int], AlertRecord]]:
        spec, episode = self.specs[rule], batch.episode(d, rule)
        context = batch.context(d, self.model_version)
        hot = np.flatnonzero(firing[idx])
        out = []
        j = 0 if episode.status != "idle" else (int(hot[0]) if len(hot) else len(idx))
        while j < len(idx):
            i = int(idx[j])
            alert = advance(
                episode,
                spec,
                float(score[i]),
                int(readings.ts[i]),
                int(readings.seq[i]),
                context,
                lambda i=i: describe(i, episode.metric),
            )
            if alert is not None:
                updates: dict[str, Any] = readings.position(i)
                if rule == rules.FLEET:
                    updates["model_version"] = readings.fleet_versions[readings.device_type[i]]
                if updates:
                    alert = msgspec.structs.replace(alert, **updates)
                out.append(((d, int(batch.scored[i]), _RULE_INDEX[rule]), alert))
            if episode.status == "idle":
                later = hot[hot > j]
                j = int(later[0]) if len(later) else len(idx)
            else:
                j += 1
        batch.store_episode(d, rule, episode)
        return out

    def _describe_rule(self, readings: _Readings, rule: str) -> Describe:
        settings = self.settings

        def describe(i: int, metric: str | None = None) -> Observation:
            return rules.evaluate(readings.view(i), settings)[rule]

        return describe

    def _describe_anomaly(self, readings: _Readings) -> Describe:
        fire = self.specs[rules.ANOMALY].fire

        def describe(i: int, metric: str | None = None) -> Observation:
            """The most anomalous metric of the reading; or ``metric``, the one the open alert
            was raised on, so that its clear speaks of the same metric."""
            span = readings.entries(i)
            ranked = sorted(
                (
                    (readings.names[k], float(readings.values[k]), float(readings.alert_scores[k]))
                    for k in span
                    if not np.isnan(readings.alert_scores[k])
                ),
                key=lambda c: -c[2],
            )
            chosen = [c for c in ranked if c[0] == metric] or ranked
            if not chosen:
                return Observation(0.0, None, None, fire, "no scored metric")
            name, value, score = chosen[0]
            verdict = "is anomalous" if score >= fire else "is within its normal range"
            return Observation(
                score, name, value, fire, f"{name}={value:g} {verdict} (score {score:.2f})", tuple(ranked[:3])
            )

        return describe

    # -- device silence ------------------------------------------------------------------------------

    def _silence_in_log(self, batch: _Batch, readings: _Readings) -> list[tuple[tuple[int, int, int], AlertRecord]]:
        """A silence found in the log: a record arrived in Kafka more than the silence timeout
        after the device's previous one. The processing-time timer cannot see it when the gap
        reaches the job inside one micro-batch (catching up on a backlog, a restart, a
        replay); the log's own timestamps can, the same way on every run. Raised there and
        cleared by the next scored reading, with the alert id the timer would have given;
        nothing is raised when the timer already did."""
        gaps = np.flatnonzero((batch.log_gap > self.timeout_ms) & (batch.codes >= 0))
        devices = set(batch.codes[gaps].tolist()) | batch.open_devices(rules.SILENT)
        if not devices:
            return []
        reading_at = np.full(len(batch.codes), -1, dtype=np.int64)
        reading_at[batch.scored] = np.arange(len(batch.scored))
        spec = self.specs[rules.SILENT]
        bounds = np.searchsorted(batch.codes, np.arange(len(batch.devices) + 1))
        out = []
        for d in sorted(devices):
            episode = batch.episode(d, rules.SILENT)
            context = batch.context(d, self.model_version)
            for p in range(bounds[d], bounds[d + 1]):
                if batch.log_gap[p] > self.timeout_ms and episode.status == "idle":
                    newest, high = max(int(batch.prior_newest[p]), 0), int(batch.prior_high[p])
                    what = (
                        f"no data for {batch.log_gap[p] / 1000:.0f} s in the log (last event time {iso_time(newest)})"
                    )
                    alert = advance(
                        episode,
                        spec,
                        1.0,
                        newest,
                        high,
                        context,
                        lambda what=what: Observation(1.0, None, None, self.settings.silence_timeout_s, what),
                    )
                    if alert is not None:
                        out.append(((d, p, -1), alert))
                i = int(reading_at[p])
                if i >= 0 and episode.status != "idle":
                    alert = advance(
                        episode,
                        spec,
                        0.0,
                        int(readings.ts[i]),
                        int(readings.seq[i]),
                        context,
                        lambda: Observation(0.0, None, None, None, "device reporting again"),
                    )
                    if alert is not None:
                        out.append(((d, p, _RULE_INDEX[rules.SILENT]), alert))
            batch.store_episode(d, rules.SILENT, episode)
        return out

    def silence(self, store: DeviceStore, device_ids: Iterable[str], now_ms: int) -> BatchOutput:
        """No data from these devices for the silence timeout (the job's processing-time
        timer): raise ``device_silent`` and flush their open aggregate buckets."""
        alerts: list[AlertRecord] = []
        device_ids = list(device_ids)
        batch = _Batch.single(device_ids, store.load_many(device_ids))
        table = batch.table
        for d in np.flatnonzero(store.found).tolist():  # the store keeps nothing of devices never heard from
            episode = batch.episode(d, rules.SILENT)
            context = batch.context(d, self.model_version)
            newest = max(int(table.core[d, MAX_EVENT_MS]), 0)
            what = (
                f"no data for {(now_ms - int(table.core[d, LAST_WALL_MS])) / 1000:.0f} s "
                f"(last event time {iso_time(newest)})"
            )
            alert = advance(
                episode,
                self.specs[rules.SILENT],
                1.0,
                newest,
                int(table.core[d, SEQ_HIGH]),
                context,
                lambda what=what: Observation(1.0, None, None, self.settings.silence_timeout_s, what),
            )
            batch.store_episode(d, rules.SILENT, episode)
            if alert is not None:
                alerts.append(alert)
        batch.pack_episodes()
        aggregates = _aggregate_frame(table, table.bucket_device, table.buckets)
        table.bucket_device, table.buckets = table.bucket_device[:0], table.buckets[:0]
        store.save_many(table, now_ms)
        return BatchOutput(_empty_readings(), alerts, aggregates, [], device_ids, {})

    # -- fleet model (one per device type, trained in batch, hot-swapped) -----------------------------

    def _fleet_scores(
        self, batch: _Batch, readings: _Readings
    ) -> tuple[tuple[np.ndarray, np.ndarray], Describe] | None:
        """Every reading of a device type that has an approved fleet model, scored at once
        against the reading before it (the model's change features)."""
        if self.fleet_models is None or not readings.n:
            return None
        applies = np.zeros(readings.n, dtype=bool)
        score = np.zeros(readings.n)
        versions: dict[str, str] = {}
        for device_type in pd.unique(readings.device_type):
            entry = self.fleet_models(device_type)
            if entry is None:
                continue
            version, model = entry
            versions[device_type] = version
            rows = np.flatnonzero(readings.device_type == device_type)
            frame, previous = batch.fleet_frames(readings, rows)
            result = model.score_paired(frame, previous) if hasattr(model, "score_paired") else model.score_many(frame)
            applies[rows] = readings.in_order[rows]  # as the detectors: not on readings out of order
            score[rows] = np.asarray(result, dtype=float)
        if not versions:
            return None
        fire = self.specs[rules.FLEET].fire

        def describe(i: int, metric: str | None = None) -> Observation:
            device_type = readings.device_type[i]
            verdict = "unusual for" if score[i] >= fire else "typical of"
            return Observation(
                float(score[i]),
                None,
                None,
                fire,
                f"reading is {verdict} the {device_type} fleet (model {versions[device_type]}, score {score[i]:.2f})",
            )

        readings.fleet_versions = versions
        return (applies, score), describe

    # -- aggregates --------------------------------------------------------------------------------

    def _aggregates(self, batch: _Batch, readings: _Readings) -> pd.DataFrame:
        """Per device, metric and event-time bucket: count, sum, min, max, last and the
        highest score, each bucket emitted once when the device's event time has passed its
        end plus a grace period (a reading for a bucket already emitted -- a clock step
        back -- is left out rather than overwrite it). Open buckets stay in device state."""
        table = batch.table
        parts = [np.column_stack([table.bucket_device, table.buckets, np.full(len(table.buckets), -1.0)])]
        if readings.n:
            er = readings.entry_reading
            start = readings.ts[er] - readings.ts[er] % self.bucket_ms
            newest = batch.newest[batch.scored][er]
            fresh = np.flatnonzero(start + self.bucket_ms > newest - self.bucket_grace_ms)
            value = readings.values[fresh]
            parts.append(
                np.column_stack(
                    [
                        readings.device[er][fresh],
                        start[fresh],
                        readings.pair_slot[fresh],
                        np.ones(len(fresh)),
                        value,
                        value,
                        value,
                        value,
                        np.nan_to_num(readings.entry_scores[fresh], nan=0.0),
                        fresh.astype(float),
                    ]
                )
            )
        rows = _combine_buckets(np.vstack(parts))
        device = rows[:, 0].astype(np.int64)
        closing = rows[:, 1] + self.bucket_ms <= table.core[device, MAX_EVENT_MS] - self.bucket_grace_ms
        table.bucket_device, table.buckets = device[~closing], np.ascontiguousarray(rows[~closing, 1:])
        return _aggregate_frame(table, device[closing], rows[closing, 1:])


def _combine_buckets(rows: np.ndarray) -> np.ndarray:
    """Rows of ``device, BUCKET_FIELDS..., order`` combined per (device, start, metric):
    counts and sums added, extremes kept, ``last`` from the row of highest ``order``."""
    if not len(rows):
        return np.zeros((0, 1 + len(BUCKET_FIELDS)))
    rows = rows[np.lexsort((rows[:, 9], rows[:, 2], rows[:, 1], rows[:, 0]))]
    first = np.flatnonzero(np.r_[True, np.any(rows[1:, :3] != rows[:-1, :3], axis=1)])
    last = np.r_[first[1:], len(rows)] - 1
    return np.column_stack(
        [
            rows[first, :3],
            np.add.reduceat(rows[:, 3], first),
            np.add.reduceat(rows[:, 4], first),
            np.minimum.reduceat(rows[:, 5], first),
            np.maximum.reduceat(rows[:, 6], first),
            rows[last, 7],
            np.maximum.reduceat(rows[:, 8], first),
        ]
    )


def _aggregate_frame(table: DeviceTable, device: np.ndarray, buckets: np.ndarray) -> pd.DataFrame:
    """Closed buckets (rows of BUCKET_FIELDS; ``device`` indexes ``table``) as
    :data:`AGGREGATE_COLUMNS`."""
    device = device.astype(np.int64)
    count, total = buckets[:, 2], buckets[:, 3]
    names = (
        table.metric_name[table.metric_bounds()[device] + buckets[:, 1].astype(np.int64)]
        if len(device)
        else np.zeros(0, dtype=object)
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
    return pd.DataFrame(
        {
            "device_id": table.ids[device],
            "device_type": table.device_type[device],
            "site": table.site[device],
            "metric": names,
            "event_ms": buckets[:, 0].astype(np.int64),
            "count": count.astype(np.int64),
            "sum": total,
            "min": buckets[:, 4],
            "max": buckets[:, 5],
            "last": buckets[:, 6],
            "max_score": buckets[:, 7],
            "mean": mean,
        },
        columns=list(AGGREGATE_COLUMNS),
    )


class _Batch:
    """One partition's records sorted by (device, Kafka order), with the devices' state
    (``table``, one row per device in ``devices`` order)."""

    records: RecordColumns
    devices: Any
    codes: np.ndarray
    order: np.ndarray
    table: DeviceTable
    _open: dict[int, set[int]] | None

    @classmethod
    def sort(cls, records: RecordColumns, engine: PartitionEngine) -> _Batch:
        batch = cls()
        batch.engine = engine
        batch.records = records
        decoded = records.decoded
        batch.valid = np.array([r is None for r in decoded.reason], dtype=bool)
        key = np.where(pd.isna(records.key), decoded.device_id, records.key)
        codes, devices = pd.factorize(key, use_na_sentinel=True)
        batch.order = np.lexsort((records.offset, codes))
        batch.codes = codes[batch.order].astype(np.int64)
        batch.devices = devices  # codes ascend in sorted order: each device's records are one run
        batch.valid = batch.valid[batch.order]
        batch.seq_ts = (decoded.seq[batch.order], decoded.ts[batch.order])
        batch.event = decoded.event[batch.order]
        batch._episodes = {}
        batch._episode_rows = None
        batch._open = None
        return batch

    @classmethod
    def single(cls, device_ids: list[str], table: DeviceTable) -> _Batch:
        """Devices without records (the silence timer)."""
        batch = cls()
        batch.devices = device_ids
        batch.table = table
        batch._episodes = {}
        batch._episode_rows = None
        batch._open = None
        return batch

    def adopt_identity(self) -> None:
        """A device's type and site are those of its first valid record; a later record of
        the same device_id under another type or site is not merged into it but
        dead-lettered (``identity_conflict``): two devices sharing an id, or a device moved
        without a new id, must not mix their readings, seqs and detector state."""
        decoded, table = self.records.decoded, self.table
        positions = np.flatnonzero(self.valid & (self.codes >= 0))
        first_codes, first = np.unique(self.codes[positions], return_index=True)
        new = table.device_type[first_codes] == ""
        records = self.order[positions[first[new]]]
        table.device_type[first_codes[new]] = decoded.device_type[records]
        table.site[first_codes[new]] = decoded.site[records]
        records = self.order[positions]
        conflict = (decoded.device_type[records] != table.device_type[self.codes[positions]]) | (
            decoded.site[records] != table.site[self.codes[positions]]
        )
        self.conflict = np.zeros(len(self.order), dtype=bool)
        self.conflict[positions[conflict]] = True
        self.valid &= ~self.conflict

    def classify(self, now_ms: int) -> np.ndarray:
        """Sequence bookkeeping (compiled); returns the counters as they were before."""
        engine, table = self.engine, self.table
        table.core = np.ascontiguousarray(table.core, dtype=np.int64)
        table.seqs = np.ascontiguousarray(table.seqs, dtype=np.uint64)
        self.core = table.core
        before = self.core.copy()
        n = len(self.order)
        self.outcome = np.zeros(n, dtype=np.int8)
        self.log_gap, self.newest = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        self.prior_newest, self.prior_high = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        classify(
            self.codes,
            self.valid,
            self.seq_ts[0].astype(np.int64),
            self.seq_ts[1].astype(np.int64),
            self.records.append_ms[self.order].astype(np.int64),
            self.core,
            table.seqs,
            engine.window,
            engine.lateness_ms,
            self.outcome,
            self.log_gap,
            self.newest,
            self.prior_newest,
            self.prior_high,
        )
        self.core[:, LAST_WALL_MS] = now_ms
        self.scored = np.flatnonzero((self.outcome == SCORED_RECORD) | (self.outcome == OUT_OF_ORDER))
        self.in_order = self.outcome[self.scored] == SCORED_RECORD
        return before

    def dead_letters(self) -> list[dict[str, Any]]:
        """Contract violations and late records, with their reason and original bytes."""
        records, decoded, table = self.records, self.records.decoded, self.table
        rows = []
        for p in np.flatnonzero((self.outcome <= INVALID) | (self.outcome == LATE_RECORD)).tolist():
            r = self.order[p]
            d = self.codes[p]
            row: dict[str, Any] = {
                "kind": "dlq",
                "device_id": self.devices[d] if d >= 0 else None,
                "device_type": (table.device_type[d] or None) if d >= 0 else None,
                "site": (table.site[d] or None) if d >= 0 else None,
                "kafka_partition": records.partition,
                "kafka_offset": int(records.offset[r]),
                "raw": records.raw[r],
            }
            if self.outcome[p] == LATE_RECORD:
                lateness = self.engine.lateness_ms
                row.update(
                    kind="late",
                    seq=int(decoded.seq[r]),
                    event_ms=int(decoded.ts[r]),
                    reason="late",
                    detail=f"event time {decoded.ts[r]} is more than {lateness} ms older than the device's "
                    f"newest {self.prior_newest[p]}",
                )
            elif self.conflict[p]:
                row.update(
                    reason="identity_conflict",
                    detail=f"device {self.devices[d]} is a {table.device_type[d]} at site {table.site[d]}; "
                    f"this record says {decoded.device_type[r]} at site {decoded.site[r]}",
                )
            else:
                row.update(reason=decoded.reason[r], detail=decoded.detail[r])
            rows.append(row)
        return rows

    # -- metric slots and detector state ----------------------------------------------------------

    def assign_slots(
        self, pair_device: np.ndarray, pair_name: np.ndarray, initial: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each (device, metric) pair (distinct): its row in the table's metrics, added
        when new; its slot (rank among its device's metrics); and its detector row (-1 for
        metrics the detectors do not see)."""
        table = self.table
        rows = self._metric_rows(pair_device, pair_name)
        new = np.flatnonzero(rows < 0)
        if len(new):
            watched = scored_names(pair_name[new])
            known = len(table.metric_device)
            moved = table.add_metrics(pair_device[new], pair_name[new], watched, initial)
            found = rows >= 0
            rows[found] = moved[rows[found]]
            rows[new] = moved[known:]
        slots = rows - table.metric_bounds()[pair_device] if len(rows) else rows
        return rows, slots, table.metric_detector[rows] if len(rows) else rows

    def _metric_rows(self, pair_device: np.ndarray, pair_name: np.ndarray) -> np.ndarray:
        table = self.table
        if not len(table.metric_device) or not len(pair_device):
            return np.full(len(pair_device), -1, dtype=np.int64)
        codes, names = pd.factorize(np.concatenate([table.metric_name, pair_name.astype(object)]))
        width = max(len(names), 1)
        known = table.metric_device * width + codes[: len(table.metric_name)]
        wanted = pair_device.astype(np.int64) * width + codes[len(table.metric_name) :]
        return pd.Index(known).get_indexer(wanted).astype(np.int64)

    def remember_last(self, pair_row: np.ndarray, pair_codes: np.ndarray, values: np.ndarray, ok: np.ndarray) -> None:
        """Each metric's newest in-range value (the fleet model's previous reading)."""
        positions = np.flatnonzero(ok)
        if not len(positions):
            return
        newest = np.full(len(pair_row), -1, dtype=np.int64)
        np.maximum.at(newest, pair_codes[positions], positions)
        hit = newest >= 0
        self.table.metric_last[pair_row[hit]] = values[newest[hit]]

    def fleet_frames(self, readings: _Readings, rows: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The readings ``rows`` as a frame (one column per in-range metric) and each one's
        previous reading (from the device's state for its first one in the batch)."""
        in_rows = np.isin(readings.entry_reading, rows) & ~readings.entry_oor
        long = pd.DataFrame(
            {
                "reading": readings.entry_reading[in_rows],
                "metric": readings.names[in_rows],
                "value": readings.values[in_rows],
            }
        )
        frame = long.pivot(index="reading", columns="metric", values="value").reindex(rows)
        previous = frame.shift(1).to_numpy(copy=True)
        device = readings.device[rows]
        first = np.flatnonzero(np.r_[True, device[1:] != device[:-1]])
        table = self.table
        kept = np.isin(table.metric_device, device[first]) & ~np.isnan(table.metric_last)
        last = pd.DataFrame(
            {"device": table.metric_device[kept], "metric": table.metric_name[kept], "value": table.metric_last[kept]}
        ).pivot(index="device", columns="metric", values="value")
        known = np.isin(device[first], last.index)
        previous[first[known]] = last.reindex(index=device[first[known]], columns=frame.columns).to_numpy()
        previous[first[~known]] = frame.to_numpy()[first[~known]]
        return frame.reset_index(drop=True), pd.DataFrame(previous, columns=frame.columns)

    # -- alert episodes ---------------------------------------------------------------------------

    def open_devices(self, rule: str) -> set[int]:
        """Devices with a pending or open alert of ``rule`` (their lifecycle must see every
        reading). Read from the stored episodes once per batch, not once per rule: each rule's
        lifecycle runs once per batch, before any of its episodes is touched."""
        if self._open is None:
            table = self.table
            self._open = {
                code: set(table.episode_device[table.episodes[:, EP_RULE] == code].tolist())
                for code in np.unique(table.episodes[:, EP_RULE]).tolist()
            }
        return set(self._open.get(_RULE_INDEX[rule], ()))

    def episode(self, d: int, rule: str) -> Episode:
        found = self._episodes.get((d, rule))
        if found is not None:
            return found
        table, code = self.table, _RULE_INDEX[rule]
        if self._episode_rows is None:
            self._episode_rows = {
                key: i
                for i, key in enumerate(
                    zip(table.episode_device.tolist(), table.episodes[:, EP_RULE].tolist(), strict=True)
                )
            }
        at = self._episode_rows.get((d, code))
        episode = Episode()
        if at is not None:
            row = table.episodes[at]
            episode = Episode(
                _STATUS[int(row[EP_STATUS])],
                int(row[EP_ABOVE]),
                int(row[EP_BELOW]),
                int(row[EP_START_MS]),
                int(row[EP_START_SEQ]),
                int(row[EP_LAST_MS]),
                int(row[EP_OCCURRENCES]),
                float(table.peaks[at]),
            )
            metric, names = int(row[EP_METRIC]), table.metric_names(d)
            episode.metric = names[metric] if 0 <= metric < len(names) else None
            if episode.status == "open":
                episode.alert_id = alert_id(self.devices[d], rule, episode.start_ms)
        self._episodes[(d, rule)] = episode
        return episode

    def store_episode(self, d: int, rule: str, episode: Episode) -> None:
        self._episodes[(d, rule)] = episode

    def pack_episodes(self) -> None:
        """Write the episodes this batch touched back into the table (idle ones are
        dropped: an idle rule keeps no state)."""
        if not self._episodes:
            return
        table = self.table
        touched = {(d, _RULE_INDEX[rule]) for d, rule in self._episodes}
        keep = np.array(
            [
                key not in touched
                for key in zip(table.episode_device.tolist(), table.episodes[:, EP_RULE].tolist(), strict=True)
            ],
            dtype=bool,
        )
        devices, rows, peaks = [], [], []
        for (d, rule), e in sorted(self._episodes.items(), key=lambda item: (item[0][0], _RULE_INDEX[item[0][1]])):
            if e.status == "idle":
                continue
            names = table.metric_names(d)
            metric = names.index(e.metric) if e.metric in names else -1
            devices.append(d)
            rows.append(
                [
                    _RULE_INDEX[rule],
                    _STATUS_CODE[e.status],
                    e.above,
                    e.below,
                    e.start_ms,
                    e.start_seq,
                    e.last_ms,
                    e.occurrences,
                    metric,
                ]
            )
            peaks.append(e.peak_score)
        device = np.concatenate([table.episode_device[keep], np.array(devices, dtype=np.int64)])
        order = np.argsort(device, kind="stable")
        table.episode_device = device[order]
        table.episodes = np.concatenate(
            [table.episodes[keep], np.array(rows, dtype=np.int64).reshape(-1, len(EPISODE_FIELDS))]
        )[order]
        table.peaks = np.concatenate([table.peaks[keep], np.array(peaks, dtype=np.float64)])[order]
        self._episode_rows = None
        self._open = None

    def context(self, d: int, model_version: str) -> AlertContext:
        table = self.table
        return AlertContext(DeviceIdentity(self.devices[d], table.device_type[d], table.site[d]), model_version)


# --- frames ----------------------------------------------------------------------------------------


def _empty_readings() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=object) for c in READING_COLUMNS})


def _grouped(entry_reading: np.ndarray, values: np.ndarray, mask: np.ndarray, n: int) -> np.ndarray:
    """Per reading, its entries where ``mask`` holds, as an array (None where it has none):
    an object column of few non-null cells, cheap to convert."""
    out = np.full(n, None, dtype=object)
    hits = np.flatnonzero(mask)
    if len(hits):
        rows, starts = np.unique(entry_reading[hits], return_index=True)
        for row, piece in zip(rows.tolist(), np.split(values[hits], starts[1:]), strict=True):
            out[row] = piece
    return out
