"""From rule scores to alert records: the lifecycle of every (device, rule) that fires or has
an alert open, and the device-silence rule (found in the log, or by the job's timer).

The rules score every reading at once (:func:`iotwatch.streaming.rules.rule_scores`); only here does
the engine loop in Python, and only over the devices where a rule fires or an alert is open.
Alerts are listed in (device, Kafka order, rule order), the same on every run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import msgspec
import numpy as np

from iotwatch.contract.alerts import AlertRecord, iso_time
from iotwatch.contract.detection import Rule
from iotwatch.settings import StreamSettings
from iotwatch.streaming import rules
from iotwatch.streaming.alerting import EpisodeStatus, Observation, RuleSpec, advance
from iotwatch.streaming.device_state import LAST_WALL_MS, MAX_EVENT_MS, SEQ_HIGH
from iotwatch.streaming.device_table import DeviceTable
from iotwatch.streaming.episode_book import RULE_CODE, EpisodeBook
from iotwatch.streaming.fleet_scoring import FleetScores
from iotwatch.streaming.scored_readings import ScoredReadings
from iotwatch.streaming.sorted_batch import Sequenced, SortedBatch

#: Describes reading ``i`` for an alert record; the metric is the one an open alert was raised on.
Describe = Callable[[int, str | None], Observation]
#: An alert and where it sorts: (device, position in the batch, rule code).
_Placed = tuple[tuple[int, int, int], AlertRecord]


@dataclass(frozen=True)
class AlertRules:
    """The job's rules with their anti-flap parameters (:func:`iotwatch.streaming.rules.rule_specs`);
    ``anomaly_banks``: the anomaly rule on each detector bank's scores (its levels and
    detector, :class:`~iotwatch.streaming.detector_plan.DetectorPlan`), chosen by each
    reading's bank (none: ``specs``' for all)."""

    settings: StreamSettings
    specs: dict[str, RuleSpec]
    anomaly_banks: tuple[RuleSpec, ...] = ()

    def _anomaly_spec(self, bank: int) -> RuleSpec:
        return self.anomaly_banks[bank] if self.anomaly_banks else self.specs[Rule.ANOMALY_SCORE]

    @property
    def timeout_ms(self) -> int:
        return int(self.settings.silence_timeout_s * 1000)

    def raise_and_clear(
        self,
        batch: SortedBatch,
        sequenced: Sequenced,
        readings: ScoredReadings,
        book: EpisodeBook,
        fleet: FleetScores | None,
        event_clock_ms: int = 0,
    ) -> list[AlertRecord]:
        """The alerts this batch raises and clears, in (device, Kafka order, rule order);
        ``event_clock_ms``: the newest event time of the partition's earlier batches."""
        found: list[_Placed] = []
        scores = rules.rule_scores(readings, self.settings)
        scores[Rule.ANOMALY_SCORE] = (np.ones(readings.n, dtype=bool), readings.anomaly)
        describe: dict[str, Describe] = {rule: self._describe_rule(readings, rule) for rule in scores}
        describe[Rule.ANOMALY_SCORE] = self._describe_anomaly(readings)
        if fleet is not None:
            scores[Rule.FLEET_ANOMALY] = (fleet.applies, fleet.score)

            def describe_fleet(i: int, _metric: str | None = None) -> Observation:
                return fleet.describe(readings, i)

            describe[Rule.FLEET_ANOMALY] = describe_fleet
        bounds = np.searchsorted(readings.device, np.arange(len(batch.devices) + 1))
        holds: dict[str, np.ndarray] = {}
        if Rule.STUCK_HVAC in scores:
            holds[Rule.STUCK_HVAC] = rules.stuck_hvac_hold_ms(readings, self.settings)
        for rule, (applies, score) in scores.items():
            fire: float | np.ndarray = self.specs[rule].fire
            if rule == Rule.ANOMALY_SCORE and self.anomaly_banks:
                fire = np.array([spec.fire for spec in self.anomaly_banks])[readings.bank]
            firing = applies & (score >= fire)
            candidates = set(np.unique(readings.device[firing]).tolist()) | book.open_devices(rule)
            for d in sorted(candidates):
                lo, hi = bounds[d], bounds[d + 1]
                idx = lo + np.flatnonzero(applies[lo:hi])
                spec = self.specs[rule]
                if rule == Rule.ANOMALY_SCORE and hi > lo:
                    spec = self._anomaly_spec(int(readings.bank[lo]))
                found.extend(
                    self._run_episode(
                        sequenced, readings, book, d, spec, idx, score, firing, describe[rule], fleet, holds.get(rule)
                    )
                )
        found.extend(self._silences_in_log(batch, sequenced, readings, book, event_clock_ms))
        found.sort(key=lambda item: item[0])
        return [alert for _, alert in found]

    def _run_episode(
        self,
        sequenced: Sequenced,
        readings: ScoredReadings,
        book: EpisodeBook,
        d: int,
        spec: RuleSpec,
        idx: np.ndarray,
        score: np.ndarray,
        firing: np.ndarray,
        describe: Describe,
        fleet: FleetScores | None,
        hold_ms: np.ndarray | None = None,
    ) -> list[_Placed]:
        """``hold_ms``: a rule whose hold depends on the reading (:func:`rules.stuck_hvac_hold_ms`)."""
        rule = spec.name
        episode = book.episode(d, rule)
        context = book.context(d)
        hot = np.flatnonzero(firing[idx])
        out = []
        j = 0 if episode.status is not EpisodeStatus.IDLE else (int(hot[0]) if len(hot) else len(idx))
        while j < len(idx):
            i = int(idx[j])

            def observed(i: int = i) -> Observation:
                return describe(i, episode.metric)

            held = spec if hold_ms is None else replace(spec, hold_ms=int(hold_ms[i]))
            alert = advance(
                episode, held, float(score[i]), int(readings.ts[i]), int(readings.seq[i]), context, observed
            )
            if alert is not None:
                updates: dict[str, object] = dict(readings.position(i))
                if rule == Rule.FLEET_ANOMALY and fleet is not None:
                    updates["model_version"] = fleet.versions[readings.device_type[i]]
                elif rule == Rule.ANOMALY_SCORE and spec.detector != self.specs[rule].detector:
                    updates["model_version"] = f"{spec.detector}@online"  # a device type's own detector
                if updates:
                    alert = msgspec.structs.replace(alert, **updates)
                out.append(((d, int(sequenced.scored[i]), RULE_CODE[rule]), alert))
            if episode.status is EpisodeStatus.IDLE:
                later = hot[hot > j]
                j = int(later[0]) if len(later) else len(idx)
            else:
                j += 1
        return out

    def _describe_rule(self, readings: ScoredReadings, rule: str) -> Describe:
        settings = self.settings

        def describe(i: int, metric: str | None = None) -> Observation:
            return rules.evaluate(readings.view(i), settings)[rule]

        return describe

    def _describe_anomaly(self, readings: ScoredReadings) -> Describe:
        def describe(i: int, metric: str | None = None) -> Observation:
            """The most anomalous metric of the reading; or ``metric``, the one the open alert
            was raised on, so that its clear speaks of the same metric."""
            fire = self._anomaly_spec(int(readings.bank[i])).fire
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

    def _silences_in_log(
        self,
        batch: SortedBatch,
        sequenced: Sequenced,
        readings: ScoredReadings,
        book: EpisodeBook,
        event_clock_ms: int = 0,
    ) -> list[_Placed]:
        """A silence found in the log: a record arrived in Kafka more than the silence timeout
        after the device's previous one. The processing-time timer cannot see it when the gap
        reaches the job inside one micro-batch (catching up on a backlog, a restart, a
        replay); the log's own timestamps can, the same way on every run. Raised there and
        cleared by the next scored reading, with the alert id the timer would have given;
        nothing is raised when the timer already did.

        A gap counts only where the device fell behind its peers: its event time jumped by
        the timeout too, and other records of the partition carry event times inside the
        gap. The backlog after an outage of the pipeline arrives late in the log but with
        the event times of the outage, device after device: no silence."""
        timeout_ms = self.timeout_ms
        log_gap = sequenced.log_gap
        event_gap = np.where(sequenced.prior_newest >= 0, batch.ts - sequenced.prior_newest, 0)
        gaps = np.flatnonzero((log_gap > timeout_ms) & (event_gap > timeout_ms) & (batch.codes >= 0))
        if len(gaps):
            events = np.sort(batch.ts[batch.valid & (batch.codes >= 0)])
            start = sequenced.prior_newest[gaps] + timeout_ms
            peers = np.searchsorted(events, batch.ts[gaps], "left") > np.searchsorted(events, start, "left")
            peers |= (event_clock_ms >= start) & (event_clock_ms < batch.ts[gaps])
            gaps = gaps[peers]
        devices = set(batch.codes[gaps].tolist()) | book.open_devices(Rule.DEVICE_SILENT)
        if not devices:
            return []
        in_gap = np.zeros(len(batch.codes), dtype=bool)
        in_gap[gaps] = True
        reading_at = np.full(len(batch.codes), -1, dtype=np.int64)
        reading_at[sequenced.scored] = np.arange(len(sequenced.scored))
        spec = self.specs[Rule.DEVICE_SILENT]
        bounds = np.searchsorted(batch.codes, np.arange(len(batch.devices) + 1))
        out: list[_Placed] = []
        for d in sorted(devices):
            episode = book.episode(d, Rule.DEVICE_SILENT)
            context = book.context(d)
            for p in range(bounds[d], bounds[d + 1]):
                if in_gap[p] and episode.status is EpisodeStatus.IDLE:
                    newest, high = max(int(sequenced.prior_newest[p]), 0), int(sequenced.prior_high[p])
                    what = f"no data for {log_gap[p] / 1000:.0f} s in the log (last event time {iso_time(newest)})"
                    alert = advance(episode, spec, 1.0, newest, high, context, self._silent(what))
                    if alert is not None:
                        out.append(((d, p, -1), alert))
                i = int(reading_at[p])
                if i >= 0 and episode.status is not EpisodeStatus.IDLE:
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
                        out.append(((d, p, RULE_CODE[Rule.DEVICE_SILENT]), alert))
        return out

    def silence_timer(self, table: DeviceTable, found: np.ndarray, book: EpisodeBook, now_ms: int) -> list[AlertRecord]:
        """``device_silent`` for the devices of ``table`` the job's processing-time timer found
        silent (``found``: the store knew them; it keeps nothing of devices never heard from)."""
        alerts: list[AlertRecord] = []
        for d in np.flatnonzero(found).tolist():
            episode = book.episode(d, Rule.DEVICE_SILENT)
            newest = max(int(table.core[d, MAX_EVENT_MS]), 0)
            what = (
                f"no data for {(now_ms - int(table.core[d, LAST_WALL_MS])) / 1000:.0f} s "
                f"(last event time {iso_time(newest)})"
            )
            alert = advance(
                episode,
                self.specs[Rule.DEVICE_SILENT],
                1.0,
                newest,
                int(table.core[d, SEQ_HIGH]),
                book.context(d),
                self._silent(what),
            )
            if alert is not None:
                alerts.append(alert)
        return alerts

    def _silent(self, what: str) -> Callable[[], Observation]:
        return lambda: Observation(1.0, None, None, self.settings.silence_timeout_s, what)
