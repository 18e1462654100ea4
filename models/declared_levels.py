"""The streaming job's default detector: episode_likelihood, and the levels of a declared
value range when the metric has one."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from iotwatch.models.episode_likelihood import EpisodeLikelihood
from iotwatch.models.kernels import Kernel
from iotwatch.models.kernels import declared_levels as kernel

__all__ = ["DeclaredLevels"]


class DeclaredLevels(EpisodeLikelihood):
    """:class:`~iotwatch.models.episode_likelihood.EpisodeLikelihood` on a metric with no
    declared range (scores equal to it, reading by reading), and on one whose range is
    declared (:meth:`~iotwatch.models.base.Detector.declare`: an operator's normal range,
    or NAB's ``inputMin`` / ``inputMax``) the larger of its score less ``shift_decades``
    decades and a *level* view: how rarely the reading's level of the declared range (cut
    in 24, 32 and 40 levels, the least surprising) has been visited so far, with one alarm
    per episode (half-life ``level_hold_halflife`` readings), the decades of both times
    ``stretch`` (NAB's optimised threshold on these scores, 0.28 unstretched, falls at the
    job's fire score 0.40 stretched; a stretch reorders nothing). The level view scores
    from the declared probation on (without one, from ``warmup``). There the likelihood
    views' variance floor is ``declared_min_variance`` (0.03), the floor they were chosen
    with beside the level view; a metric without a declared range keeps ``min_variance``.

    The view and its parameters were chosen on the tuning half of nab-dev under NAB's
    protocol (``docs/detection.md``, ``evaluation/results/nab_protocols.md``). The kernel
    (:mod:`iotwatch.models.kernels.declared_levels`) holds 152 numbers a metric (1,216 B).

    Examples
    --------
    >>> det = DeclaredLevels().declare(0.0, 100.0, 100)
    >>> t = lambda i: 1_700_000_000_000 + i * 60_000
    >>> quiet = max(det.score_learn_one({"m": 10.0 + i % 7}, t(i)) for i in range(2000))
    >>> round(quiet, 2), round(det.score_learn_one({"m": 90.0}, t(2000)), 2)
    (0.06, 0.59)
    """

    name: ClassVar[str] = "declared_levels"
    _kernel: ClassVar[Kernel[Any]] = kernel

    def __init__(
        self,
        shift_decades: float = 8.0,
        level_hold_halflife: float = 300.0,
        stretch: float = 1.7,
        declared_min_variance: float = 0.03,
        **params: Any,
    ) -> None:
        self.shift_decades = shift_decades
        self.declared_min_variance = declared_min_variance
        self.level_hold_halflife = level_hold_halflife
        self.stretch = stretch
        super().__init__(**params)

    def get_params(self) -> dict[str, Any]:
        """Its own parameters and episode_likelihood's."""
        return {
            "shift_decades": self.shift_decades,
            "level_hold_halflife": self.level_hold_halflife,
            "stretch": self.stretch,
            "declared_min_variance": self.declared_min_variance,
            **{p: getattr(self, p) for p in inspect.signature(EpisodeLikelihood.__init__).parameters if p != "self"},
        }
