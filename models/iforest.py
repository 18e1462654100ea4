"""Fleet model: scikit-learn's Isolation Forest, trained in batch, scored in batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
from sklearn.ensemble import IsolationForest as _SkIsolationForest

from iotwatch.contract.detection import AnomalyKind
from iotwatch.models.base import Detector, Reading

__all__ = ["IsolationForest"]

#: scikit-learn's trees work in float32: values (and their differences) stay well inside it.
_FEATURE_LIMIT = 1e18


@dataclass(eq=False, repr=False)
class IsolationForest(Detector):
    """Isolation Forest (Liu et al., 2008) over metric values and their changes.

    Trained in batch -- :meth:`fit` on a frame of readings from many devices of one type
    -- and shared as one saved model. Used as a stream detector it buffers readings,
    fits once ``min_train`` are in and refits every ``refit_every`` readings on the last
    ``max_train``; rows are scored by the model fitted *before* them (no look-ahead), and
    :meth:`score_learn_many` does exactly that with one vectorised call per refit block.
    The score is the forest's normalised anomaly score ``2 ** (-E[h] / c(n))`` in
    ``[0, 1]`` (about 0.5 for typical rows).

    Parameters
    ----------
    metrics
        Metric columns, in order; ``None`` takes them from the first reading.
    n_estimators, max_samples
        Forest size and sub-sample per tree.
    min_train, refit_every, max_train
        Streaming schedule, in readings.
    seed
        Random seed.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> det = IsolationForest(seed=0).fit(pd.DataFrame({"v": rng.normal(0, 1, 2000)}))
    >>> [round(float(s), 2) for s in det.score_many(pd.DataFrame({"v": [0.0, 8.0]}))]
    [0.41, 0.74]
    """

    name: ClassVar[str] = "isolation_forest"
    compact_state: ClassVar[bool] = False
    detects: ClassVar[frozenset[AnomalyKind]] = frozenset(
        {AnomalyKind.SPIKE, AnomalyKind.LEVEL_SHIFT, AnomalyKind.NOISE_BURST}
    )

    metrics: list[str] | None = None
    n_estimators: int = 100
    max_samples: int = 256
    min_train: int = 300
    refit_every: int = 1000
    max_train: int = 5000
    seed: int = 42

    def __post_init__(self) -> None:
        self._forest: _SkIsolationForest | None = None
        self._columns: list[str] | None = list(self.metrics) if self.metrics is not None else None
        self._buffer: list[list[float]] = []
        self._since_fit = 0

    # --- batch API ------------------------------------------------------------------

    def _features(self, values: np.ndarray, previous: np.ndarray | None = None) -> np.ndarray:
        """Values (NaN -> column's previous value) and first differences, ``(n, 2m)``."""
        frame = pd.DataFrame(np.clip(values, -_FEATURE_LIMIT, _FEATURE_LIMIT))
        if previous is not None:
            previous = np.clip(previous.reshape(1, -1), -_FEATURE_LIMIT, _FEATURE_LIMIT)
            frame = pd.concat([pd.DataFrame(previous), frame], ignore_index=True)
        frame = frame.ffill().fillna(0.0)
        diffs = frame.diff().fillna(0.0)
        if previous is not None:
            frame, diffs = frame.iloc[1:], diffs.iloc[1:]
        return np.hstack([frame.to_numpy(dtype=float), diffs.to_numpy(dtype=float)])

    def fit(self, frame: pd.DataFrame, previous: pd.DataFrame | None = None) -> IsolationForest:
        """Train on a frame of readings (one column per metric).

        Without ``previous`` the rows are one stream in time order and changes are taken
        between consecutive rows. With ``previous`` -- same columns, for each row the
        preceding reading *of the same device* (NaN when there is none) -- the rows may
        come from many devices in any order, e.g. a random sample of an archive.
        """
        self._columns = list(self.metrics) if self.metrics is not None else list(frame.columns)
        rows = frame[self._columns].to_numpy(dtype=float)
        if previous is None:
            self._fit_features(self._features(rows))
        else:
            before = previous.reindex(columns=self._columns).to_numpy(dtype=float)
            self._fit_features(self._paired_features(rows, before))
        return self

    @staticmethod
    def _paired_features(values: np.ndarray, previous: np.ndarray) -> np.ndarray:
        """:meth:`_features` for rows that each carry their own previous reading."""
        previous = np.clip(previous, -_FEATURE_LIMIT, _FEATURE_LIMIT)
        values = np.clip(values, -_FEATURE_LIMIT, _FEATURE_LIMIT)
        values = np.where(np.isnan(values), previous, values)
        diffs = np.nan_to_num(values - previous, nan=0.0)
        return np.hstack([np.nan_to_num(values, nan=0.0), diffs])

    def _fit_features(self, features: np.ndarray) -> None:
        self._forest = _SkIsolationForest(
            n_estimators=self.n_estimators, max_samples=min(self.max_samples, len(features)), random_state=self.seed
        ).fit(features)

    def score_paired(self, frame: pd.DataFrame, previous: pd.DataFrame) -> np.ndarray:
        """Scores of rows that each carry their previous reading (see :meth:`fit`)."""
        if self._forest is None or self._columns is None:
            return np.zeros(len(frame))
        values = frame.reindex(columns=self._columns).to_numpy(dtype=float)
        before = previous.reindex(columns=self._columns).to_numpy(dtype=float)
        scores: np.ndarray = np.clip(-self._forest.score_samples(self._paired_features(values, before)), 0.0, 1.0)
        return scores

    def score_many(self, frame: pd.DataFrame) -> np.ndarray:
        """Scores of a batch of readings (frame columns = metrics) with the current model."""
        if self._forest is None or self._columns is None:
            return np.zeros(len(frame))
        values = frame.reindex(columns=self._columns).to_numpy(dtype=float)
        return self._score_rows(values, None)

    def _score_rows(self, values: np.ndarray, previous: np.ndarray | None) -> np.ndarray:
        assert self._forest is not None
        scores: np.ndarray = np.clip(-self._forest.score_samples(self._features(values, previous)), 0.0, 1.0)
        return scores

    # --- streaming API --------------------------------------------------------------

    def _row(self, x: Reading) -> list[float] | None:
        if self._columns is None:
            self._columns = sorted(x)
        if not self._columns:
            return None
        return [float(x.get(c, np.nan)) for c in self._columns]

    def warmup_readings(self) -> int:
        return self.min_train  # the first fit

    def score_one(self, x: Reading, t_ms: int) -> float:
        row = self._row(x) if x else None
        if row is None or self._forest is None:
            return 0.0
        previous = np.array(self._buffer[-1]) if self._buffer else None
        return float(self._score_rows(np.array([row]), previous)[0])

    def learn_one(self, x: Reading, t_ms: int) -> None:
        row = self._row(x) if x else None
        if row is None:
            return
        self._buffer.append(row)
        del self._buffer[: -self.max_train]
        self._since_fit += 1
        due = self._since_fit >= (self.refit_every if self._forest is not None else self.min_train)
        if due and len(self._buffer) >= self.min_train:
            self._fit_features(self._features(np.array(self._buffer)))
            self._since_fit = 0

    def score_learn_many(self, values: np.ndarray, t_ms: np.ndarray, metrics: list[str]) -> np.ndarray:
        values = np.asarray(values, dtype=float).reshape(len(t_ms), len(metrics))
        if self._columns is None:
            self._columns = list(metrics) if self.metrics is None else list(self.metrics)
        index = [metrics.index(c) if c in metrics else -1 for c in self._columns]
        rows = np.array([[r[i] if i >= 0 else np.nan for i in index] for r in values.tolist()]).reshape(
            len(values), len(self._columns)
        )
        out = np.zeros(len(rows))
        i = 0
        while i < len(rows):
            block = (self.refit_every if self._forest is not None else self.min_train) - self._since_fit
            j = min(len(rows), i + max(block, 1))
            if self._forest is not None:
                previous = np.array(self._buffer[-1]) if self._buffer else None
                out[i:j] = self._score_rows(rows[i:j], previous)
            for row in rows[i:j].tolist():
                self.learn_one(dict(zip(self._columns, row, strict=True)), 0)
            i = j
        return out
