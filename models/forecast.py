"""Forecast-residual detector: an online Holt-Winters forecaster and a residual z-score."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from iotwatch.contract.detection import AnomalyKind
from iotwatch.models.base import Detector, Reading, UnivariateMixin, z_to_score
from iotwatch.models.kernels.primitives import hw_deviation, hw_learn
from iotwatch.models.numeric import decay_weight

__all__ = ["HoltWintersResidual"]


@dataclass(eq=False, repr=False)
class HoltWintersResidual(UnivariateMixin, Detector):
    """How far a reading lands from a one-step Holt-Winters forecast.

    The forecast is ``level + trend + season[phase]`` (additive seasonality over phase
    buckets of the event time, hour of day by default). The residual is divided by an
    exponentially weighted residual scale; the forecaster learns from the residual
    *clipped* to ``clip`` scales, so one wild reading neither bends the forecast nor
    inflates the scale much. Because the level follows the data, the detector reacts to
    *changes* (spikes, the onset of a level shift, a sudden burst of noise) and then settles.

    Parameters
    ----------
    metric
        Metric to watch; ``None`` means the reading's only metric.
    alpha, beta, gamma
        Smoothing of level, trend and seasonal terms (0 < value <= 1).
    season_buckets
        Phase buckets per ``season_period_s`` (0 disables seasonality).
    season_period_s
        Season length in seconds.
    halflife
        Half-life of the residual scale, in readings.
    clip
        Residual clipping for learning the forecast, in scales (twice that for the scale).
    warmup
        Readings before any score is given.
    z_half
        Residual, in scales, that scores 0.5.
    reset_after
        After this many consecutive residuals beyond ``clip`` scales on the same side the
        level jumps to the reading (0: never). A clipped forecaster would otherwise take
        hundreds of readings to follow a genuine change of level (a refuelled tank), and
        report it all along.

    Examples
    --------
    >>> det = HoltWintersResidual(season_buckets=0)
    >>> for i in range(200):
    ...     det.learn_one({"kwh": 10 + 0.05 * i + (0.2 if i % 2 else -0.2)}, i * 60_000)
    >>> round(det.score_one({"kwh": 20.2}, 200 * 60_000), 2), round(det.score_one({"kwh": 30.0}, 200 * 60_000), 2)
    (0.03, 0.99)
    """

    name: ClassVar[str] = "holt_winters"
    detects: ClassVar[frozenset[AnomalyKind]] = frozenset(
        {AnomalyKind.SPIKE, AnomalyKind.LEVEL_SHIFT, AnomalyKind.NOISE_BURST}
    )

    metric: str | None = None
    alpha: float = 0.3
    beta: float = 0.01
    gamma: float = 0.05
    season_buckets: int = 24
    season_period_s: float = 86_400.0
    halflife: float = 300.0
    clip: float = 3.0
    warmup: int = 30
    z_half: float = 4.0
    reset_after: int = 0

    def __post_init__(self) -> None:
        self._a_var = decay_weight(self.halflife)
        self.set_state({})

    def to_state(self) -> dict[str, Any]:
        return {
            "n": self._n,
            "level": self._level,
            "trend": self._trend,
            "rvar": self._rvar,
            "season": list(self._season),
            "beyond": self._beyond,
        }

    def set_state(self, state: Mapping[str, Any]) -> Self:
        self._n = int(state.get("n", 0))
        self._level = float(state.get("level", 0.0))
        self._trend = float(state.get("trend", 0.0))
        self._rvar = float(state.get("rvar", 0.0))
        self._season = [float(v) for v in state.get("season", [0.0] * self.season_buckets)]
        self._beyond = int(state.get("beyond", 0))  # signed run of clipped residuals
        return self

    def _bucket(self, t_ms: int) -> int:
        if not self.season_buckets:
            return -1
        period_ms = self.season_period_s * 1000.0
        return int((t_ms % period_ms) / period_ms * self.season_buckets) % self.season_buckets

    def forecast(self, t_ms: int) -> float:
        """The one-step forecast for a reading at ``t_ms``."""
        b = self._bucket(t_ms)
        return self._level + self._trend + (self._season[b] if b >= 0 else 0.0)

    def deviation(self, x: Reading, t_ms: int) -> float | None:
        """The signed forecast residual in residual scales, or ``None`` while warming up."""
        v = self._value(x)
        if v is None or self._n < self.warmup:
            return None
        b = self._bucket(t_ms)
        state = (float(self._n), self._level, self._trend, self._rvar, float(self._beyond))
        return hw_deviation(state, (float(self.warmup),), v, self._season[b] if b >= 0 else 0.0)

    def score_one(self, x: Reading, t_ms: int) -> float:
        z = self.deviation(x, t_ms)
        return 0.0 if z is None else z_to_score(abs(z), self.z_half)

    def learn_one(self, x: Reading, t_ms: int) -> None:
        v = self._value(x)
        if v is None:
            return
        b = self._bucket(t_ms)
        state = (float(self._n), self._level, self._trend, self._rvar, float(self._beyond))
        params = (
            float(self.warmup),
            self.alpha,
            self.beta,
            self._a_var,
            float(self.clip),
            float(self.reset_after),
            self.gamma,
        )
        (n, self._level, self._trend, self._rvar, beyond), season = hw_learn(
            state, params, v, self._season[b] if b >= 0 else 0.0
        )
        self._n, self._beyond = int(n), int(beyond)
        if b >= 0:
            self._season[b] = season
