"""Level, change and stuck-value detectors, each judged by its own extreme-value tail."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from iotwatch.contract.detection import AnomalyKind
from iotwatch.models.kernels import Kernel, KernelDetector
from iotwatch.models.kernels import tail_ensemble as kernel

__all__ = ["TailEnsemble"]


@dataclass(eq=False, repr=False)
class TailEnsemble(KernelDetector):
    """A per-(device, metric) detector the streaming job can run (it has a kernel).

    Three views of one metric (level: robust z against a slow baseline,
    :class:`iotwatch.models.robust_zscore.RobustZScore`; change: the one-step Holt forecast
    residual, :func:`iotwatch.models.kernels.primitives.hw_learn`; stuck:
    :class:`iotwatch.models.repeat_run.RepeatRun`), each judged by its own
    :class:`iotwatch.models.exceedance.ExceedanceTail`; the smallest tail, times three,
    scores on the log scale of :func:`iotwatch.models.numeric.log_tail_score`
    (docs/detection.md, "The shared views"). No score for the first ``warmup`` readings.
    The arithmetic is one compiled kernel (:mod:`iotwatch.models.kernels.tail_ensemble`);
    this class holds one stream's row.

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

    metric: str | None = None
    warmup: int = 60
    level_halflife: float = 500.0
    change_alpha: float = 0.3
    z_threshold: float = 3.0
    tail_index_prior: float = 0.15
    max_repeat_rate: float = 0.2
