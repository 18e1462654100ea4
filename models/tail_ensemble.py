"""Level, change and stuck-value detectors, each judged by its own extreme-value tail."""

from __future__ import annotations

from typing import Any, ClassVar

from iotwatch.contract.detection import AnomalyKind
from iotwatch.models.kernels import Kernel, KernelDetector
from iotwatch.models.kernels import tail_ensemble as kernel

__all__ = ["TailEnsemble"]


class TailEnsemble(KernelDetector):
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
    and the score is its log scale (:func:`iotwatch.models.numeric.log_tail_score`: 0.5 at
    1e-5, 0.6 at 1e-7.5). Unlike a likelihood fitted to bounded raw scores, the tail keeps
    extreme deviations extreme, and because every tail is the stream's own, one threshold
    means one false-alarm rate per reading on every device and metric. No score is given
    for the first ``warmup`` readings.

    The arithmetic is one compiled kernel (:mod:`iotwatch.models.kernels.tail_ensemble`,
    which has the layout of the state: 28 numbers), built from the members' functions in
    :mod:`iotwatch.models.kernels.primitives` (the level and change views without a
    season); this class holds one stream's row and calls the kernel's step on a batch of
    one reading.

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
    _kernel: ClassVar[Kernel[Any]] = kernel
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
        self._start()
