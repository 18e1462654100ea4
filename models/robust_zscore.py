"""Robust EWMA z-score against a global and a seasonal (time-of-day) baseline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from iotwatch.contract.detection import AnomalyKind
from iotwatch.models.base import Detector, Reading, UnivariateMixin, z_to_score
from iotwatch.models.kernels.primitives import scale, zscore_learn, zscore_update
from iotwatch.models.numeric import decay_weight

__all__ = ["RobustZScore"]


@dataclass(eq=False, repr=False)
class RobustZScore(UnivariateMixin, Detector):
    """Deviation from a robust exponentially weighted baseline, seasonality aware.

    A global level and scale are tracked with exponentially weighted moments of
    *Huber-clipped* residuals: a residual larger than ``clip`` scales moves the baseline
    by at most ``clip`` scales, so a spike does not drag the baseline (the robustness a
    running median/MAD gives, in a few numbers). When ``season_buckets > 0`` a seasonal
    level is kept per phase bucket (hour of day by default, from the event time) with one
    pooled residual scale; once a bucket has seen ``season_warmup`` readings the
    seasonal deviation is used, so a value that is normal at noon but not at midnight is
    flagged. The deviation ``|z|`` maps to a score with :func:`iotwatch.models.base.z_to_score`
    (``z_half`` scales give 0.5).

    Parameters
    ----------
    metric
        Metric to watch; ``None`` means the reading's only metric.
    halflife
        Half-life of the global baseline, in readings.
    season_buckets
        Phase buckets per ``season_period_s`` (0 disables the seasonal baseline).
    season_period_s
        Length of the season in seconds (a day by default).
    season_halflife
        Half-life of each bucket's level, in updates of that bucket.
    season_warmup
        Readings a bucket needs before its level is trusted.
    clip
        Huber clipping of residuals, in scales, for the level (twice that for the scale,
        so a genuinely wider spread is learned within tens of readings).
    warmup
        Readings before any score is given (scores are 0 until then).
    z_half
        Deviation, in scales, that scores 0.5.

    Notes
    -----
    The scale never drops below 0.1 % of the level's magnitude (plus 1e-9), so a
    perfectly constant signal does not turn every later quantisation step into a spike.

    Examples
    --------
    >>> import random
    >>> rng = random.Random(7)
    >>> det = RobustZScore(season_buckets=0)
    >>> for i in range(300):
    ...     det.learn_one({"temp": 20 + rng.gauss(0, 0.5)}, i * 60_000)
    >>> round(det.score_one({"temp": 20.3}, 300 * 60_000), 2), round(det.score_one({"temp": 26.0}, 300 * 60_000), 2)
    (0.02, 0.92)
    """

    name: ClassVar[str] = "robust_zscore"
    detects: ClassVar[frozenset[AnomalyKind]] = frozenset(
        {AnomalyKind.SPIKE, AnomalyKind.LEVEL_SHIFT, AnomalyKind.DRIFT, AnomalyKind.NOISE_BURST}
    )

    metric: str | None = None
    halflife: float = 500.0
    season_buckets: int = 24
    season_period_s: float = 86_400.0
    season_halflife: float = 10.0
    season_warmup: int = 4
    clip: float = 3.0
    warmup: int = 30
    z_half: float = 4.0

    def __post_init__(self) -> None:
        self._a = decay_weight(self.halflife)
        self._a_season = decay_weight(self.season_halflife)
        self.set_state({})

    # --- state ----------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "n": self._n,
            "mu": self._mu,
            "var": self._var,
            "rvar": self._rvar,
            "smu": list(self._smu),
            "sn": list(self._sn),
        }

    def set_state(self, state: Mapping[str, Any]) -> Self:
        k = self.season_buckets
        self._n = int(state.get("n", 0))
        self._mu = float(state.get("mu", 0.0))
        self._var = float(state.get("var", 0.0))
        self._rvar = float(state.get("rvar", 0.0))
        self._smu = [float(v) for v in state.get("smu", [0.0] * k)]
        self._sn = [int(v) for v in state.get("sn", [0] * k)]
        return self

    # --- scoring --------------------------------------------------------------------

    def _bucket(self, t_ms: int) -> int:
        period_ms = self.season_period_s * 1000.0
        return int((t_ms % period_ms) / period_ms * self.season_buckets) % self.season_buckets

    def deviation(self, x: Reading, t_ms: int) -> float | None:
        """The signed robust z of the reading, or ``None`` while warming up."""
        v = self._value(x)
        if v is None or self._n < self.warmup:
            return None
        if self.season_buckets:
            b = self._bucket(t_ms)
            if self._sn[b] >= self.season_warmup:
                return (v - self._smu[b]) / scale(self._rvar, self._smu[b])
        return (v - self._mu) / scale(self._var, self._mu)

    def score_one(self, x: Reading, t_ms: int) -> float:
        z = self.deviation(x, t_ms)
        return 0.0 if z is None else z_to_score(abs(z), self.z_half)

    def learn_one(self, x: Reading, t_ms: int) -> None:
        v = self._value(x)
        if v is None:
            return
        n, self._mu, self._var = zscore_learn(
            (float(self._n), self._mu, self._var), (float(self.warmup), self._a, float(self.clip)), v
        )
        self._n = int(n)
        if self.season_buckets:
            b = self._bucket(t_ms)
            if self._sn[b] == 0:
                self._smu[b] = v
                if self._rvar == 0.0:
                    self._rvar = self._var
            else:
                self._smu[b], self._rvar = zscore_update(
                    v, self._smu[b], self._rvar, self._a_season, self._a, float(self.clip)
                )
            self._sn[b] += 1
