"""The readings of a micro-batch, cleaned and scored: every scored metric of every reading
through its device type's detector kernel, one call per detector of the job.

The result, :class:`ScoredReadings`, is the columns the rules, the alert lifecycle, the
aggregates and the output frame read: per reading and per entry (one metric of one reading),
no per-reading objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from iotwatch.streaming import rules
from iotwatch.streaming.cleaning import clean_entries, entry_column, scored_names
from iotwatch.streaming.coupling import explained_entries
from iotwatch.streaming.detector_plan import DetectorPlan
from iotwatch.streaming.device_table import DeviceTable
from iotwatch.streaming.metric_slots import assign_slots, remember_last
from iotwatch.streaming.sorted_batch import Sequenced, SortedBatch

#: The metrics that give a device's position; an alert raised on a reading that has them carries them.
_POSITION = frozenset({"lat_deg", "lon_deg"})


@dataclass(frozen=True)
class ScoredReadings:
    """Per-reading columns (index ``i``, in (device, Kafka order)) and per-entry columns
    (index ``k``; ``entry_reading[k]`` is its reading, entries of a reading contiguous)."""

    device: np.ndarray  # int64: row in the devices' state table
    device_type: np.ndarray
    bank: np.ndarray  # int64: the detector bank of its device type (the anomaly rule's levels)
    event: np.ndarray
    seq: np.ndarray
    ts: np.ndarray
    in_order: np.ndarray  # bool: not older than the device's newest (the detectors saw it)
    out_of_range: np.ndarray  # bool: some metric outside its physical range
    anomaly: np.ndarray  # the anomaly rule's score: the reading's highest unexplained detector score
    entry_reading: np.ndarray
    names: np.ndarray
    values: np.ndarray
    entry_oor: np.ndarray
    entry_scores: np.ndarray  # the detectors' scores (NaN: not scored)
    alert_scores: np.ndarray  # the same, but 0 where a coupling explains the move
    pair_slot: np.ndarray  # each entry's metric slot in its device's state
    starts: np.ndarray  # entries of reading i: starts[i]:starts[i + 1]
    _by_name: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    @property
    def n(self) -> int:
        return len(self.device_type)

    def metric(self, name: str) -> np.ndarray:
        """The metric's value per reading, NaN where the reading lacks it."""
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
        """Reading ``i`` as one :class:`~iotwatch.streaming.rules.ReadingView` (alert messages)."""
        span = self.entries(i)
        metrics = {self.names[k]: float(self.values[k]) for k in span}
        oor = tuple(self.names[k] for k in span if self.entry_oor[k])
        event = self.event[i]
        return rules.ReadingView(self.device_type[i], metrics, event if isinstance(event, str) else None, oor)


@dataclass(frozen=True)
class DeviceScorer:
    """The job's device detectors (:class:`~iotwatch.streaming.detector_plan.DetectorPlan`):
    each device type's kernel, parameters and the anomaly rule's levels on its scores (a
    coupling that explains a move must take it below its detector's ``clear``)."""

    plan: DetectorPlan

    def score(self, batch: SortedBatch, sequenced: Sequenced, table: DeviceTable) -> ScoredReadings:
        """Clean the readings' metrics, run each detector's kernel over every scored metric
        of its device types at once (learning as it scores), and keep each metric's newest
        value."""
        decoded = batch.records.decoded
        scored_positions = sequenced.scored
        reading_of = np.full(len(batch.records), -1, dtype=np.int64)
        reading_of[batch.order[scored_positions]] = np.arange(len(scored_positions))
        entry_reading = reading_of[decoded.metric_row]
        keep = entry_reading >= 0
        reading_device = batch.codes[scored_positions]
        reading_type = table.device_type[reading_device] if len(reading_device) else np.zeros(0, dtype=object)
        reading_bank = self.plan.banks_of(reading_type)
        er, names, values, oor, name_codes, name_list = clean_entries(
            entry_reading[keep], decoded.metric_name[keep], decoded.metric_value[keep], reading_type
        )
        entry_device = reading_device[er]
        width = max(len(name_list), 1)
        pair_codes, pair_keys = pd.factorize(entry_device.astype(np.int64) * width + name_codes)
        pair_device = (pair_keys // width).astype(np.int64)
        pair_name = (
            np.asarray(name_list, dtype=object)[pair_keys % width] if len(pair_keys) else np.zeros(0, dtype=object)
        )
        pair_row, pair_slot, pair_detector, pair_bank = assign_slots(
            table,
            pair_device,
            pair_name,
            self.plan.metric_banks(table.device_type[pair_device], pair_name),
            self.plan.initials,
            self.plan.declare if self.plan.declared else None,
        )
        # A reading that arrives after a newer one of its device is archived and goes through
        # the rules, but the detectors neither learn from it nor score it: fed out of event
        # time order, a drifting or seasonal metric would look like a jump back.
        in_order = sequenced.in_order
        watched = scored_names(name_list)[name_codes] & ~oor & in_order[er]
        scores = np.full(len(names), np.nan)
        surprises = np.full(len(names), np.nan)
        ts = batch.ts[scored_positions]
        if watched.any():
            self._score_learn(
                table,
                np.flatnonzero(watched),
                pair_detector[pair_codes],
                pair_bank[pair_codes],
                values,
                ts[er],
                scores,
                surprises,
            )
        remember_last(table, pair_row, pair_codes, values, ~oor & in_order[er])
        fire, clear = self.plan.levels(reading_bank)
        explained = explained_entries(reading_type, er, names, surprises, moved=clear, broken=fire)
        alert_scores = np.where(explained, 0.0, scores)
        n = len(scored_positions)
        anomaly = np.zeros(n)
        if watched.any():
            np.maximum.at(anomaly, er[watched], alert_scores[watched])
        return ScoredReadings(
            device=reading_device,
            device_type=reading_type,
            bank=reading_bank,
            event=batch.event[scored_positions],
            seq=batch.seq[scored_positions],
            ts=ts,
            in_order=in_order,
            out_of_range=np.bincount(er[oor], minlength=n) > 0,
            anomaly=anomaly,
            entry_reading=er,
            names=names,
            values=values,
            entry_oor=oor,
            entry_scores=scores,
            alert_scores=alert_scores,
            pair_slot=pair_slot[pair_codes] if len(pair_codes) else np.zeros(0, dtype=np.int64),
            starts=np.searchsorted(er, np.arange(n + 1)),
        )

    def _score_learn(
        self,
        table: DeviceTable,
        watched: np.ndarray,
        entry_detector: np.ndarray,
        entry_bank: np.ndarray,
        values: np.ndarray,
        entry_ts: np.ndarray,
        scores: np.ndarray,
        surprises: np.ndarray,
    ) -> None:
        """Score and learn the ``watched`` entries, each bank's through its kernel in one
        call (in entry order: a stream's readings in its order), into ``scores`` and ``surprises``."""
        for b, bank in enumerate(self.plan.banks):
            mine = watched[entry_bank[watched] == b]
            if not len(mine):
                continue
            surprise = np.empty(len(mine))
            scores[mine] = bank.kernel.score_learn_into(
                table.detectors[b],
                entry_detector[mine].astype(np.int64),
                values[mine],
                entry_ts[mine].astype(np.int64),
                bank.params,
                surprise,
            )
            surprises[mine] = surprise
