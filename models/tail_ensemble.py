"""Level, change and stuck-value detectors, each judged by its own extreme-value tail."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

from iotwatch.contract.detection import AnomalyKind
from iotwatch.models.base import Detector, Reading, UnivariateMixin
from iotwatch.models.exceedance import ExceedanceTail
from iotwatch.models.forecast import HoltWintersResidual
from iotwatch.models.likelihood import log_tail_score
from iotwatch.models.repeat_run import RepeatRun
from iotwatch.models.robust_zscore import RobustZScore

__all__ = ["TailEnsemble"]


class TailEnsemble(UnivariateMixin, Detector):
    """The per-(device, metric) detector of the streaming job.

    Three views of one metric, each a deviation with its own
    :class:`iotwatch.models.exceedance.ExceedanceTail` (peaks over threshold):

    - *level*: robust z against a slow baseline (:class:`iotwatch.models.robust_zscore.RobustZScore`)
      -- drifts over minutes to hours, long shifts;
    - *change*: the one-step Holt-Winters forecast residual in residual scales
      (:class:`iotwatch.models.forecast.HoltWintersResidual`) -- spikes, the onset of a shift,
      bursts of noise;
    - *stuck*: the run of identical readings (:class:`iotwatch.models.repeat_run.RepeatRun`) --
      flatlines.

    The reading's tail probability is the smallest of the three times three (Bonferroni),
    and the score is its log scale (:func:`iotwatch.models.likelihood.log_tail_score`: 0.5 at
    1e-5, 0.6 at 1e-7.5). Unlike a likelihood fitted to bounded raw scores, the tail keeps
    extreme deviations extreme, and because every tail is the stream's own, one threshold
    means one false-alarm rate per reading on every device and metric. No score is given
    for the first ``warmup`` readings; the state is about thirty numbers.

    Examples
    --------
    >>> import math, random
    >>> rng = random.Random(1)
    >>> det = TailEnsemble()
    >>> t = lambda i: 1_700_000_000_000 + i * 60_000
    >>> signal = lambda i: round(20 + 2 * math.sin(2 * math.pi * i / 1440) + rng.gauss(0, 0.1), 2)
    >>> quiet = max(det.score_learn_one({"t": signal(i)}, t(i)) for i in range(3000))
    >>> spike = det.score_learn_one({"t": 25.0}, t(3000))
    >>> quiet < 0.5 < 0.6 < spike
    True
    """

    name: ClassVar[str] = "tail_ensemble"
    #: Drifts over minutes to hours are caught as level changes; a drift over days is
    #: the seasonal :class:`~iotwatch.models.robust_zscore.RobustZScore`'s job (not claimed here).
    detects: ClassVar[frozenset[AnomalyKind]] = frozenset(
        {AnomalyKind.SPIKE, AnomalyKind.LEVEL_SHIFT, AnomalyKind.NOISE_BURST, AnomalyKind.FLATLINE}
    )

    def __init__(
        self,
        metric: str | None = None,
        warmup: int = 60,
        level_halflife: float = 500.0,
        change_alpha: float = 0.3,
        z_threshold: float = 3.0,
        tail_index_prior: float = 0.15,
        max_repeat_rate: float = 0.2,
    ) -> None:
        self.metric = metric
        self.warmup = warmup
        self.level_halflife = level_halflife
        self.change_alpha = change_alpha
        self.z_threshold = z_threshold
        self.tail_index_prior = tail_index_prior
        self.max_repeat_rate = max_repeat_rate
        members = min(warmup, 30)
        self._level = RobustZScore(metric, halflife=level_halflife, season_buckets=0, warmup=members)
        self._change = HoltWintersResidual(metric, alpha=change_alpha, season_buckets=0, warmup=members, reset_after=3)
        self._stuck = RepeatRun(metric, max_repeat_rate=max_repeat_rate)
        self._level_tail = ExceedanceTail(threshold=z_threshold, prior_index=tail_index_prior)
        self._change_tail = ExceedanceTail(threshold=z_threshold, prior_index=tail_index_prior)
        self.set_state({})

    def to_state(self) -> dict[str, Any]:
        return {
            "n": self._n,
            "level": self._level.to_state(),
            "change": self._change.to_state(),
            "stuck": self._stuck.to_state(),
            "level_tail": self._level_tail.to_state(),
            "change_tail": self._change_tail.to_state(),
        }

    def set_state(self, state: Mapping[str, Any]) -> Self:
        self._n = int(state.get("n", 0))
        self._level.set_state(state.get("level") or {})
        self._change.set_state(state.get("change") or {})
        self._stuck.set_state(state.get("stuck") or {})
        self._level_tail.set_state(state.get("level_tail") or {})
        self._change_tail.set_state(state.get("change_tail") or {})
        return self

    def _deviations(self, x: Reading, t_ms: int) -> tuple[float | None, float | None]:
        level, change = self._level.deviation(x, t_ms), self._change.deviation(x, t_ms)
        return (None if level is None else abs(level)), (None if change is None else abs(change))

    def tails(self, x: Reading, t_ms: int) -> dict[str, float]:
        """Each view's tail probability for this reading (1.0 while a view warms up)."""
        level, change = self._deviations(x, t_ms)
        return {
            "level": 1.0 if level is None else self._level_tail.tail(level),
            "change": 1.0 if change is None else self._change_tail.tail(change),
            "stuck": self._stuck.tail(x, t_ms),
        }

    def score_one(self, x: Reading, t_ms: int) -> float:
        if self._n < self.warmup or self._value(x) is None:
            return 0.0
        return log_tail_score(min(1.0, 3.0 * min(self.tails(x, t_ms).values())))

    def learn_one(self, x: Reading, t_ms: int) -> None:
        self.score_learn_one(x, t_ms)

    def score_learn_one(self, x: Reading, t_ms: int) -> float:
        """Score, then learn, computing each view's deviation once (the streaming hot path)."""
        if self._value(x) is None:
            return 0.0
        level, change = self._deviations(x, t_ms)
        score = 0.0
        if self._n >= self.warmup:
            tail = min(
                1.0 if level is None else self._level_tail.tail(level),
                1.0 if change is None else self._change_tail.tail(change),
                self._stuck.tail(x, t_ms),
            )
            score = log_tail_score(min(1.0, 3.0 * tail))
        if level is not None:
            self._level_tail.learn(level)
        if change is not None:
            self._change_tail.learn(change)
        self._level.learn_one(x, t_ms)
        self._change.learn_one(x, t_ms)
        self._stuck.learn_one(x, t_ms)
        self._n += 1
        return score
