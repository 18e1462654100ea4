"""Fleet model: Half-Space Trees with rank calibration and repeat suppression."""

from __future__ import annotations

from typing import ClassVar

from iotwatch.contract.detection import AnomalyKind
from iotwatch.models.base import Detector, Reading
from iotwatch.models.halfspace import HalfSpaceTrees
from iotwatch.models.rank_calibration import RankCalibrator

__all__ = ["RankedHalfSpaceTrees"]


class RankedHalfSpaceTrees(Detector):
    """Half-Space Trees whose scores are ranked against the stream's own recent scores.

    :class:`iotwatch.models.halfspace.HalfSpaceTrees` gives the raw score;
    :class:`iotwatch.models.rank_calibration.RankCalibrator` turns it into a log-scaled empirical
    tail probability over the last ``history`` raw scores and reports only the first of a
    burst of high scores (``suppress`` readings). The output is comparable across streams
    (one threshold for all), and one anomaly raises one alarm. ``score-csv --detector
    hst_ranked`` and ``iotwatch evaluate --detector hst_ranked`` run it.

    Parameters
    ----------
    features, n_trees, height, window_size, seed
        Passed to :class:`iotwatch.models.halfspace.HalfSpaceTrees`.
    history, warmup, suppress
        Passed to :class:`iotwatch.models.rank_calibration.RankCalibrator`.

    Examples
    --------
    >>> import random
    >>> rng = random.Random(0)
    >>> det = RankedHalfSpaceTrees(history=1000, suppress=50)
    >>> quiet = [det.score_learn_one({"v": rng.gauss(0, 1)}, i) for i in range(1500)]
    >>> spike = det.score_learn_one({"v": 12.0}, 1500)
    >>> max(quiet[-500:]) < spike
    True
    """

    name: ClassVar[str] = "hst_ranked"
    compact_state: ClassVar[bool] = False
    detects: ClassVar[frozenset[AnomalyKind]] = frozenset()

    def __init__(
        self,
        features: list[str] | None = None,
        n_trees: int = 10,
        height: int = 8,
        window_size: int = 250,
        seed: int = 42,
        history: int = 5000,
        warmup: int = 100,
        suppress: int = 200,
    ) -> None:
        self.features = features
        self.n_trees = n_trees
        self.height = height
        self.window_size = window_size
        self.seed = seed
        self.history = history
        self.warmup = warmup
        self.suppress = suppress
        self._trees = HalfSpaceTrees(features, n_trees, height, window_size, seed)
        self._calibrator = RankCalibrator(history, warmup, suppress)

    def warmup_readings(self) -> int:
        return max(self.window_size, self.warmup)  # the trees' first window, then the ranks'

    def score_one(self, x: Reading, t_ms: int) -> float:
        return self._calibrator.score(self._trees.score_one(x, t_ms))

    def learn_one(self, x: Reading, t_ms: int) -> None:
        self._calibrator.learn(self._trees.score_one(x, t_ms))
        self._trees.learn_one(x, t_ms)

    def score_learn_one(self, x: Reading, t_ms: int) -> float:
        raw = self._trees.score_one(x, t_ms)
        score = self._calibrator.score_learn(raw)
        self._trees.learn_one(x, t_ms)
        return score
