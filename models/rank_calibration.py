"""Rank calibration: how unusual a raw score is among a stream's recent raw scores.

Some raw scores are badly described by a Gaussian -- Half-Space Trees' scores sit in a
narrow band just under 1 with a lumpy distribution -- so a Gaussian anomaly likelihood
misjudges them. This calibrator uses the empirical tail
instead: among the last ``history`` raw scores, the share at least as high as the new
one, ``(count + 1) / (n + 1)``, put on the log scale the tail detectors use
(:func:`iotwatch.models.numeric.log_tail_score`), plus ``1e-3`` times the raw score to break
ties. No distribution is assumed, and each stream is judged against its own history.

It then *suppresses repeats*: a calibrated score that does not exceed every calibrated
score of the previous ``suppress`` readings is reported as 0. The first reading of a
burst keeps its score and the rest of the burst stays silent, so a single anomaly does
not raise a string of alarms (false positives cost; a second detection in the same
anomaly window earns nothing). Both steps look only at the past.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

from iotwatch.models.numeric import log_tail_score

__all__ = ["RankCalibrator"]


@dataclass(eq=False)
class RankCalibrator:
    """Turn raw anomaly scores into tail-probability scores, silencing repeats.

    Parameters
    ----------
    history
        Raw scores remembered for the empirical tail.
    warmup
        Raw scores seen before any calibrated score is given (0 until then).
    suppress
        Readings after a calibrated score during which only a higher one is reported.

    Examples
    --------
    >>> import random
    >>> rng = random.Random(0)
    >>> cal = RankCalibrator(history=500, warmup=50, suppress=20)
    >>> quiet = [cal.score_learn(rng.uniform(0.0, 0.5)) for _ in range(1000)]
    >>> round(max(quiet), 2), [round(cal.score_learn(0.9), 2) for _ in range(3)]
    (0.35, [0.35, 0.0, 0.0])
    """

    history: int = 5000
    warmup: int = 100
    suppress: int = 200

    def __post_init__(self) -> None:
        self._raw: deque[float] = deque()
        self._sorted: list[float] = []
        self._recent: deque[float] = deque(maxlen=max(self.suppress, 1))

    def calibrated(self, raw: float) -> float:
        """The calibrated score of ``raw`` before suppression."""
        n = len(self._sorted)
        if n < self.warmup or n == 0:
            return 0.0
        at_least = n - bisect.bisect_left(self._sorted, raw)
        return min(1.0, log_tail_score((at_least + 1) / (n + 1)) + 1e-3 * min(max(raw, 0.0), 1.0))

    def _suppressed(self, calibrated: float) -> float:
        if self.suppress > 0 and self._recent and calibrated <= max(self._recent):
            return 0.0
        return calibrated

    def score(self, raw: float) -> float:
        """Calibrated, suppressed score of ``raw`` as the next raw score, without learning it."""
        return self._suppressed(self.calibrated(raw))

    def score_learn(self, raw: float) -> float:
        """Score, then learn: the streaming step."""
        calibrated = self.calibrated(raw)
        score = self._suppressed(calibrated)
        self.learn(raw, calibrated)
        return score

    def learn(self, raw: float, calibrated: float | None = None) -> None:
        """Remember ``raw`` (and its calibrated score, for suppression)."""
        if calibrated is None:
            calibrated = self.calibrated(raw)
        if self.suppress > 0:
            self._recent.append(calibrated)
        self._raw.append(raw)
        bisect.insort(self._sorted, raw)
        if len(self._raw) > self.history:
            old = self._raw.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
