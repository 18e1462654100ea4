"""Calibrated ensemble: several compact detectors, one anomaly likelihood on top."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

import iotwatch.models.forecast
import iotwatch.models.robust_zscore  # noqa: F401
from iotwatch.contract.detection import AnomalyKind
from iotwatch.errors import UserError
from iotwatch.models.base import Detector, Reading
from iotwatch.models.likelihood import AnomalyLikelihood
from iotwatch.models.members import member_class

__all__ = ["CalibratedEnsemble", "DEFAULT_COMPONENTS"]

#: The default members: a robust baseline (level) and a forecaster (change). Their
#: seasonal terms are off: on nab-dev they cost more in start-up noise than they gained.
DEFAULT_COMPONENTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("robust_zscore", {"season_buckets": 0}),
    ("holt_winters", {"season_buckets": 0}),
)


class CalibratedEnsemble(Detector):
    """Combine compact detectors and calibrate with an anomaly likelihood.

    Each reading is scored by every component; the raw score is their maximum (or
    mean), and :class:`iotwatch.models.likelihood.AnomalyLikelihood` turns the raw score into how
    unusual the recent raw scores are *for this stream*. The output therefore means the
    same thing on every device and metric, so one alert threshold (around 0.5, a tail
    probability of 1e-5) serves the fleet. The state is the components' states plus
    the calibrator's few numbers, so it fits the per-key state store.

    Parameters
    ----------
    components
        ``(catalog name, params)`` pairs of compact detectors (:data:`iotwatch.models.members.MEMBERS`).
    combine
        ``"max"`` or ``"mean"`` of the component scores.
    warmup
        Readings the members learn from before their scores are calibrated: their
        start-up scores would otherwise distort the long-run fit.
    short_window, halflife, learning_period, instant
        Passed to :class:`iotwatch.models.likelihood.AnomalyLikelihood`.

    Examples
    --------
    >>> import math, random
    >>> rng = random.Random(1)
    >>> det = CalibratedEnsemble()
    >>> t = lambda i: 1_700_000_000_000 + i * 300_000
    >>> signal = lambda i: 10 + 3 * math.sin(2 * math.pi * i / 288) + rng.gauss(0, 0.3)
    >>> quiet = max(det.score_learn_one({"v": signal(i)}, t(i)) for i in range(3000))
    >>> spike = det.score_learn_one({"v": 25.0}, t(3000))
    >>> quiet < 0.5 < spike
    True
    """

    name: ClassVar[str] = "ensemble"
    detects: ClassVar[frozenset[AnomalyKind]] = frozenset(
        {AnomalyKind.SPIKE, AnomalyKind.LEVEL_SHIFT, AnomalyKind.NOISE_BURST}
    )

    def __init__(
        self,
        components: Sequence[Sequence[Any]] = DEFAULT_COMPONENTS,
        combine: str = "max",
        warmup: int = 150,
        short_window: int = 10,
        halflife: float = 1000.0,
        learning_period: int = 150,
        instant: bool = True,
    ) -> None:
        if combine not in ("max", "mean"):
            raise UserError(f"combine must be 'max' or 'mean', not {combine!r}")
        self.components: list[list[Any]] = [[str(n), dict(p)] for n, p in components]
        self.combine = combine
        self.warmup = warmup
        self.instant = instant
        self.short_window = short_window
        self.halflife = halflife
        self.learning_period = learning_period
        self._members: list[Detector] = []
        for member_name, params in self.components:
            member = member_class(member_name)(**params)
            if not member.compact_state:
                raise ValueError(f"ensemble members must keep compact state; {member_name} does not")
            self._members.append(member)
        self._calibrator = AnomalyLikelihood(short_window, halflife, learning_period, instant=instant)
        self._n = 0

    def to_state(self) -> dict[str, Any]:
        return {
            "n": self._n,
            "members": [m.to_state() for m in self._members],
            "likelihood": self._calibrator.to_state(),
        }

    def set_state(self, state: Mapping[str, Any]) -> Self:
        self._n = int(state.get("n", 0))
        members = state.get("members") or [{} for _ in self._members]
        for member, member_state in zip(self._members, members, strict=True):
            member.set_state(member_state)
        self._calibrator.set_state(state.get("likelihood", {}))
        return self

    def raw_score(self, x: Reading, t_ms: int) -> float:
        """The combined, uncalibrated score of the members."""
        scores = [m.score_one(x, t_ms) for m in self._members]
        return max(scores) if self.combine == "max" else sum(scores) / len(scores)

    def warmup_readings(self) -> int:
        return self.warmup + self.learning_period

    def score_one(self, x: Reading, t_ms: int) -> float:
        if self._n < self.warmup:
            return 0.0
        return self._calibrator.score(self.raw_score(x, t_ms))

    def learn_one(self, x: Reading, t_ms: int) -> None:
        self._learn(x, t_ms, self.raw_score(x, t_ms))

    def score_learn_one(self, x: Reading, t_ms: int) -> float:
        raw = self.raw_score(x, t_ms)
        score = 0.0 if self._n < self.warmup else self._calibrator.score(raw)
        self._learn(x, t_ms, raw)
        return score

    def _learn(self, x: Reading, t_ms: int, raw: float) -> None:
        for member in self._members:
            member.learn_one(x, t_ms)
        if self._n >= self.warmup:
            self._calibrator.learn(raw)
        self._n += 1
