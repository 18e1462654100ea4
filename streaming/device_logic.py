"""Everything the job does for one device, without Spark: testable on plain Python data.

Records are handled in the order they were appended to Kafka (partition, offset), which
makes every result independent of how the stream was cut into micro-batches: a restart
from a checkpoint, or a replay, reproduces the same scores and the same alert ids.

Each input record ends as exactly one of: ``dlq`` (contract violation), ``duplicate``
(seq already seen), ``late`` (arrived after a newer seq of its device, with an event time
older than the device's newest minus the allowed lateness) or scored ``reading`` rows (one
per metric, long format). A reading that is newest by seq but far behind in event time is
a clock that stepped back, not lateness: scored, and counted as a clock step. Alerts and
per-bucket aggregates are emitted beside them, and one ``tally`` row per device and batch with the
counts of each outcome (cheap accounting for the sinks, without a shuffle).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from iotwatch.contract import ContractViolation, Telemetry, decode_telemetry
from iotwatch.settings import StreamSettings
from models.base import Detector
from models.catalog import make
from streaming import rules
from streaming.alerting import AlertContext, DeviceIdentity, Episode, Observation, RuleSpec, step
from streaming.cleaning import QUALITY_OK, is_scored, normalise_units, quality_of, with_derived
from streaming.device_state import DeviceState

#: Columns of every row the per-device logic emits (see :data:`streaming.schemas.OUTPUT_SCHEMA`).
OUTPUT_COLUMNS = ("kind", "device_id", "device_type", "site", "seq", "event_ms", "metric", "value", "score",
                  "detector", "quality", "body", "raw", "kafka_partition", "kafka_offset")

BUCKET_STATS = ("count", "sum", "min", "max", "last", "max_score")


#: device type -> (model version label, fleet detector), or None when no model is approved.
FleetLookup = Callable[[str], "tuple[str, Detector] | None"]


@dataclass(frozen=True)
class InputRecord:
    key: str
    value: bytes | None
    partition: int
    offset: int
    timestamp_ms: int | None = None  # the Kafka record's timestamp (the gateway's produce time)


class DeviceLogic:
    """The per-device step, configured once per job from the stream settings."""

    def __init__(self, settings: StreamSettings, model_version: str | None = None,
                 fleet_models: FleetLookup | None = None) -> None:
        self.settings = settings
        self.fleet_models = fleet_models
        self.detector_name = settings.device_detector
        self.detector_params = dict(settings.device_detector_params)
        if not make(self.detector_name, **self.detector_params).compact_state:  # fails fast on a bad name too
            raise ValueError(f"{self.detector_name} is a fleet model: per-device state needs a compact detector")
        self.specs: dict[str, RuleSpec] = rules.rule_specs(settings, self.detector_name)
        self.model_version = model_version or f"{self.detector_name}@online"
        self.lateness_ms = int(settings.allowed_lateness_s * 1000)
        self.bucket_ms = settings.aggregate_interval_s * 1000
        self.bucket_grace_ms = min(self.lateness_ms, 10_000)

    # -- records -------------------------------------------------------------------------

    def process(self, state: DeviceState, records: Iterable[InputRecord], now_ms: int | None = None
                ) -> Iterator[dict[str, Any]]:
        """Handle one device's records of a micro-batch (in Kafka order), updating ``state``."""
        detectors: dict[str, Detector] = {}
        scored: list[tuple[Telemetry, dict[str, float]]] = []
        before = asdict(state.counters)
        for record in sorted(records, key=lambda r: (r.partition, r.offset)):
            yield from self._one(state, record, detectors, scored)
        for metric, detector in detectors.items():
            state.detectors[metric] = detector.to_state()
        yield from self._fleet(state, scored)
        state.last_wall_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        yield from self._close_buckets(state, final=False)
        tally = {name: value - before[name] for name, value in asdict(state.counters).items()}
        yield {**self._base("tally", state), "body": json.dumps(tally)}

    def _one(self, state: DeviceState, record: InputRecord, detectors: dict[str, Detector],
             scored: list[tuple[Telemetry, dict[str, float]]]) -> Iterator[dict[str, Any]]:
        state.counters.received += 1
        yield from self._gap(state, record)
        try:
            message = decode_telemetry(record.value or b"")
            if record.key and message.device_id != record.key:
                raise ContractViolation("key_mismatch", f"Kafka key {record.key!r} != device_id {message.device_id!r}")
        except ContractViolation as exc:
            state.counters.dead_lettered += 1
            yield self._row("dlq", state, record, body={"reason": exc.reason, "detail": exc.detail},
                            raw=record.value, device_id=record.key or None)
            return
        if not state.device_id:
            state.device_id, state.device_type, state.site = message.device_id, message.device_type, message.site
        in_order = message.seq > state.seqs.high
        outcome = state.seqs.observe(message.seq, self.settings.dedup_window)
        if outcome == "duplicate":
            state.counters.duplicates += 1
            yield self._row("duplicate", state, record, seq=message.seq, event_ms=message.ts)
            return
        if outcome == "reset":
            state.counters.seq_resets += 1
            state.seqs.high, state.seqs.bits = message.seq, 1
        behind = state.max_event_ms >= 0 and message.ts < state.max_event_ms - self.lateness_ms
        if behind and (in_order or outcome == "reset"):
            # Newer than everything the device sent before, yet far behind in event time: the
            # device's clock stepped back (a reset or NTP correction), which is not lateness.
            # The reading is scored; only its aggregate bucket may already be closed.
            state.counters.clock_steps += 1
        elif behind:
            state.counters.late += 1
            yield self._row("late", state, record, seq=message.seq, event_ms=message.ts, raw=record.value,
                            body={"reason": "late", "detail": f"event time {message.ts} is more than "
                                  f"{self.lateness_ms} ms older than the device's newest {state.max_event_ms}"})
            return
        state.max_event_ms = max(state.max_event_ms, message.ts)
        state.counters.scored += 1
        yield from self._score(state, record, message, detectors, scored)

    def _detector(self, state: DeviceState, metric: str, cache: dict[str, Detector]) -> Detector:
        detector = cache.get(metric)
        if detector is None:
            detector = make(self.detector_name, **self.detector_params)  # fed {metric: value}
            saved = state.detectors.get(metric)
            if saved is not None:
                detector.set_state(saved)
            cache[metric] = detector
        return detector

    def _score(self, state: DeviceState, record: InputRecord, message: Telemetry,
               detectors: dict[str, Detector], scored: list[tuple[Telemetry, dict[str, float]]]
               ) -> Iterator[dict[str, Any]]:
        metrics = with_derived(state.device_type, normalise_units(message.metrics))
        quality = {m: quality_of(state.device_type, m, v) for m, v in metrics.items()}
        scored.append((message, {m: v for m, v in metrics.items() if quality[m] == QUALITY_OK}))
        scores: dict[str, float] = {}
        for metric, value in metrics.items():
            if quality[metric] == QUALITY_OK and is_scored(metric):
                scores[metric] = self._detector(state, metric, detectors).score_learn_one({metric: value}, message.ts)
        for metric, value in sorted(metrics.items()):
            yield self._row("reading", state, record, seq=message.seq, event_ms=message.ts, metric=metric,
                            value=value, score=scores.get(metric), quality=quality[metric],
                            detector=self.detector_name if metric in scores else None)
        self._aggregate(state, message.ts, metrics, scores)
        ranked = sorted(scores.items(), key=lambda item: -item[1])
        top_metric, top_score = ranked[0] if ranked else (None, 0.0)
        verdict = "is anomalous" if top_score >= self.specs[rules.ANOMALY].fire else "is within its normal range"
        observations = rules.evaluate(rules.ReadingView(
            state.device_type, metrics, message.event, tuple(m for m, q in quality.items() if q != QUALITY_OK)),
            self.settings)
        observations[rules.ANOMALY] = Observation(
            top_score, top_metric, metrics.get(top_metric) if top_metric else None, self.specs[rules.ANOMALY].fire,
            f"{top_metric}={metrics[top_metric]:g} {verdict} (score {top_score:.2f})" if top_metric
            else "no scored metric", tuple((m, metrics[m], s) for m, s in ranked[:3]))
        silent = state.episodes.get(rules.SILENT)
        if silent is not None and silent.status != "idle":
            observations[rules.SILENT] = Observation(0.0, None, None, None, "device reporting again")
        for rule, observation in observations.items():
            yield from self._advance(state, rule, observation, message.ts, message.seq)

    def _advance(self, state: DeviceState, rule: str, observation: Observation, event_ms: int,
                 seq: int) -> Iterator[dict[str, Any]]:
        episode = state.episodes.get(rule)
        if episode is None:
            if observation.score < self.specs[rule].fire:
                return  # idle and quiet: keep no state for it
            episode = state.episodes[rule] = Episode()
        context = AlertContext(DeviceIdentity(state.device_id, state.device_type, state.site), self.model_version)
        alert = step(episode, self.specs[rule], observation, event_ms, seq, context)
        if episode.status == "idle":
            del state.episodes[rule]
        if alert is not None:
            yield self._alert_row(state, alert, seq)

    # -- fleet model (one per device type, trained in batch, hot-swapped) ----------------------

    def _fleet(self, state: DeviceState, scored: list[tuple[Telemetry, dict[str, float]]]) -> Iterator[dict[str, Any]]:
        """Score this batch's readings of the device with its type's fleet model at once
        (vectorised), each against the reading before it, and step the fleet_anomaly rule."""
        if not scored or self.fleet_models is None:
            return
        entry = self.fleet_models(state.device_type)
        if entry is None:
            return
        version, model = entry
        frame = pd.DataFrame([metrics for _, metrics in scored])
        previous = pd.concat([pd.DataFrame([state.last_metrics or scored[0][1]]), frame.iloc[:-1]],
                             ignore_index=True)
        scores = model.score_paired(frame, previous) if hasattr(model, "score_paired") else model.score_many(frame)
        state.last_metrics = scored[-1][1]
        for (message, _metrics), score in zip(scored, scores.tolist(), strict=True):
            verdict = "unusual for" if score >= self.specs[rules.FLEET].fire else "typical of"
            observation = Observation(float(score), None, None, self.specs[rules.FLEET].fire,
                                      f"reading is {verdict} the {state.device_type} fleet "
                                      f"(model {version}, score {score:.2f})")
            for row in self._advance(state, rules.FLEET, observation, message.ts, message.seq):
                body = json.loads(row["body"])
                body["model_version"] = version
                yield {**row, "body": json.dumps(body)}

    # -- silence (called from a processing-time timer) --------------------------------------

    def _gap(self, state: DeviceState, record: InputRecord) -> Iterator[dict[str, Any]]:
        """A silence found in the log: the record arrived in Kafka more than the silence
        timeout after the device's previous one. The processing-time timer cannot see it
        when the gap reaches the job inside one micro-batch (the job catching up on a
        backlog, a restart, a replay); the log's own timestamps can, the same way on every
        run. Raised here and cleared by this very reading, with the alert id the timer
        would have given; nothing is raised when the timer already did."""
        stamp = record.timestamp_ms
        if stamp is None or stamp <= 0:
            return
        previous, state.last_append_ms = state.last_append_ms, max(state.last_append_ms, stamp)
        gap_s = (stamp - previous) / 1000
        if not previous or gap_s <= self.settings.silence_timeout_s or rules.SILENT in state.episodes:
            return
        yield from self._raise_silent(state, f"no data for {gap_s:.0f} s in the log")

    def silence(self, state: DeviceState, now_ms: int) -> Iterator[dict[str, Any]]:
        """No data for the silence timeout: raise ``device_silent`` and flush open buckets."""
        yield from self._raise_silent(state, f"no data for {(now_ms - state.last_wall_ms) / 1000:.0f} s")
        yield from self._close_buckets(state, final=True)

    def _raise_silent(self, state: DeviceState, what: str) -> Iterator[dict[str, Any]]:
        """``device_silent`` from the device's newest reading: its event time starts the
        episode, so the timer and a gap in the log give one silence the same alert id."""
        observation = Observation(1.0, None, None, self.settings.silence_timeout_s,
                                  f"{what} (last event time {state.max_event_ms})")
        yield from self._advance(state, rules.SILENT, observation, max(state.max_event_ms, 0), state.seqs.high)

    # -- aggregates ----------------------------------------------------------------------------

    def _aggregate(self, state: DeviceState, event_ms: int, metrics: dict[str, float], scores: dict[str, float]) -> None:
        start = event_ms - event_ms % self.bucket_ms
        if start + self.bucket_ms <= state.max_event_ms - self.bucket_grace_ms:
            return  # that bucket was emitted already (a clock step back): re-emitting would overwrite it
        bucket = state.buckets.setdefault(start, {})
        for metric, value in metrics.items():
            score = scores.get(metric, 0.0)
            stats = bucket.get(metric)
            if stats is None:
                bucket[metric] = [1, value, value, value, value, score]
            else:
                stats[0] += 1
                stats[1] += value
                stats[2] = min(stats[2], value)
                stats[3] = max(stats[3], value)
                stats[4] = value
                stats[5] = max(stats[5], score)

    def _close_buckets(self, state: DeviceState, final: bool) -> Iterator[dict[str, Any]]:
        """Emit each bucket once, when the device's event time has passed its end (plus a
        grace period for out-of-order readings), or all of them when the device went silent."""
        horizon = state.max_event_ms - self.bucket_grace_ms
        for start in sorted(state.buckets):
            if not final and start + self.bucket_ms > horizon:
                continue
            for metric, stats in sorted(state.buckets.pop(start).items()):
                body = dict(zip(BUCKET_STATS, stats, strict=True))
                body["mean"] = stats[1] / stats[0]
                yield {**self._base("aggregate", state), "event_ms": start, "metric": metric,
                       "value": body["mean"], "score": stats[5], "body": json.dumps(body)}

    # -- rows -------------------------------------------------------------------------------------

    @staticmethod
    def _base(kind: str, state: DeviceState) -> dict[str, Any]:
        return {"kind": kind, "device_id": state.device_id or None, "device_type": state.device_type or None,
                "site": state.site or None}

    def _row(self, kind: str, state: DeviceState, record: InputRecord, *, seq: int | None = None,
             event_ms: int | None = None, metric: str | None = None, value: float | None = None,
             score: float | None = None, quality: str | None = None, detector: str | None = None,
             body: dict[str, Any] | None = None, raw: bytes | None = None,
             device_id: str | None = None) -> dict[str, Any]:
        row = self._base(kind, state)
        if device_id is not None and row["device_id"] is None:
            row["device_id"] = device_id
        row.update(seq=seq, event_ms=event_ms, metric=metric, value=value, score=score, quality=quality,
                   detector=detector, body=json.dumps(body) if body is not None else None, raw=raw,
                   kafka_partition=record.partition, kafka_offset=record.offset)
        return row

    def _alert_row(self, state: DeviceState, alert: dict[str, Any], seq: int) -> dict[str, Any]:
        return {**self._base("alert", state), "seq": seq, "event_ms": alert["last_event_ms"],
                "metric": alert["metric"], "value": alert["value"], "score": alert["score"],
                "detector": alert["detector"], "quality": alert["state"], "body": json.dumps(alert)}
