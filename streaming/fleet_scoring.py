"""Fleet-model scores: every reading of a device type that has an approved fleet model
(one per device type, trained in batch and hot-swapped), scored at once against the
device's reading before it (the model's change features)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from iotwatch.streaming.alerting import Observation
from iotwatch.streaming.device_table import DeviceTable
from iotwatch.streaming.scored_readings import ScoredReadings


@runtime_checkable
class FleetModel(Protocol):
    """What the engine needs of a fleet model: scores of a frame of readings (one column per
    metric), in [0, 1]."""

    def score_many(self, frame: pd.DataFrame) -> np.ndarray: ...


@runtime_checkable
class PairedFleetModel(FleetModel, Protocol):
    """A fleet model that also reads each reading's previous one (change features)."""

    def score_paired(self, frame: pd.DataFrame, previous: pd.DataFrame) -> np.ndarray: ...


#: device type -> (model version label, fleet model), or None when no model is approved.
FleetLookup = Callable[[str], "tuple[str, FleetModel] | None"]


@dataclass(frozen=True)
class FleetScores:
    """Per reading: whether a fleet model judged it and its score; the model version per
    device type."""

    applies: np.ndarray
    score: np.ndarray
    versions: dict[str, str]
    fire: float

    def describe(self, readings: ScoredReadings, i: int) -> Observation:
        device_type = readings.device_type[i]
        score = float(self.score[i])
        verdict = "unusual for" if score >= self.fire else "typical of"
        return Observation(
            score,
            None,
            None,
            self.fire,
            f"reading is {verdict} the {device_type} fleet (model {self.versions[device_type]}, score {score:.2f})",
        )


def fleet_scores(
    models: FleetLookup | None, readings: ScoredReadings, table: DeviceTable, fire: float
) -> FleetScores | None:
    """Scores of the readings whose device type has an approved model, or None when none has."""
    if models is None or not readings.n:
        return None
    applies = np.zeros(readings.n, dtype=bool)
    score = np.zeros(readings.n)
    versions: dict[str, str] = {}
    for device_type in pd.unique(readings.device_type):
        entry = models(device_type)
        if entry is None:
            continue
        version, model = entry
        versions[device_type] = version
        rows = np.flatnonzero(readings.device_type == device_type)
        frame, previous = _frames(readings, table, rows)
        result = model.score_paired(frame, previous) if isinstance(model, PairedFleetModel) else model.score_many(frame)
        applies[rows] = readings.in_order[rows]  # as the detectors: not on readings out of order
        score[rows] = np.asarray(result, dtype=float)
    return FleetScores(applies, score, versions, fire) if versions else None


def _frames(readings: ScoredReadings, table: DeviceTable, rows: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
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
    kept = np.isin(table.metric_device, device[first]) & ~np.isnan(table.metric_last)
    last = pd.DataFrame(
        {"device": table.metric_device[kept], "metric": table.metric_name[kept], "value": table.metric_last[kept]}
    ).pivot(index="device", columns="metric", values="value")
    known = np.isin(device[first], last.index)
    previous[first[known]] = last.reindex(index=device[first[known]], columns=frame.columns).to_numpy()
    previous[first[~known]] = frame.to_numpy()[first[~known]]
    return frame.reset_index(drop=True), pd.DataFrame(previous, columns=frame.columns)
