"""Anomaly likelihood: turn raw scores into a calibrated, comparable score.

After Numenta's anomaly likelihood (Ahmad et al., 2017, "Unsupervised real-time anomaly
detection for streaming data"): the short moving average of raw scores is compared with
the distribution of that average over a long window, modelled as a Gaussian; the tail
probability says how unusual the *recent* raw scores are *for this stream*. Because each
stream is judged against its own history, one threshold works across devices and metrics.

Differences from Numenta's implementation, so the state stays a few numbers:

- the long window is exponentially weighted (``halflife`` readings) instead of a buffer
  of 8640 scores re-estimated every 100 readings;
- the tail is one-sided: only raw scores *higher* than usual are anomalous;
- with ``instant=True`` the single raw score is judged too, against its own long-run
  fit, and the smaller tail counts (times 2, a Bonferroni correction): an isolated
  extreme reading would otherwise be diluted by the moving average.

The output is a log scale of the tail probability, ``L / (L + 5)`` with
``L = -log10(tail)``: like Numenta's ``log(tail) / log(1e-10)`` it gives 0.5 at a tail
probability of 1e-5, but it does not saturate at 1e-10, so very unusual readings stay
ranked (a threshold sweep needs that).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Self

from iotwatch.models.numeric import decay_weight, log_tail_score, upper_tail

__all__ = ["AnomalyLikelihood", "log_tail_score"]


def _ewm(value: float, mean: float, var: float, a: float) -> tuple[float, float]:
    delta = value - mean
    return mean + a * delta, (1.0 - a) * (var + a * delta * delta)


class AnomalyLikelihood:
    """Calibrate a stream of raw anomaly scores in ``[0, 1]``.

    Parameters
    ----------
    short_window
        Raw scores averaged for the recent level (Numenta: 10).
    halflife
        Half-life, in readings, of the long-run mean and variance of that average.
    learning_period
        Readings before any calibrated score is given (0 until then).
    min_std
        Floor of the long-run standard deviation (Numenta: sqrt(0.0003)).
    instant
        Also judge the single latest raw score (see the module notes).

    Examples
    --------
    >>> import random
    >>> rng = random.Random(3)
    >>> cal = AnomalyLikelihood(learning_period=100)
    >>> for _ in range(1000):
    ...     _ = cal.score_learn(rng.uniform(0.0, 0.2))
    >>> round(cal.score(0.1), 2), [round(cal.score_learn(0.95), 2) for _ in range(3)]
    (0.02, [0.9, 0.89, 0.89])
    """

    def __init__(
        self,
        short_window: int = 10,
        halflife: float = 2000.0,
        learning_period: int = 300,
        min_std: float = math.sqrt(0.0003),
        instant: bool = True,
    ) -> None:
        self.short_window = short_window
        self.halflife = halflife
        self.learning_period = learning_period
        self.min_std = min_std
        self.instant = instant
        self._a = decay_weight(halflife)
        self.set_state({})

    def get_params(self) -> dict[str, Any]:
        return {
            "short_window": self.short_window,
            "halflife": self.halflife,
            "learning_period": self.learning_period,
            "min_std": self.min_std,
            "instant": self.instant,
        }

    def to_state(self) -> dict[str, Any]:
        return {
            "n": self._n,
            "mean": self._mean,
            "var": self._var,
            "raw_mean": self._raw_mean,
            "raw_var": self._raw_var,
            "recent": list(self._recent),
        }

    def set_state(self, state: Mapping[str, Any]) -> Self:
        self._n = int(state.get("n", 0))
        self._mean = float(state.get("mean", 0.0))
        self._var = float(state.get("var", 0.0))
        self._raw_mean = float(state.get("raw_mean", 0.0))
        self._raw_var = float(state.get("raw_var", 0.0))
        self._recent = [float(v) for v in state.get("recent", [])]
        return self

    def _average_with(self, raw: float) -> float:
        window = [*self._recent, raw][-self.short_window :]
        return sum(window) / len(window)

    def _gauss_tail(self, value: float, mean: float, var: float) -> float:
        z = (value - mean) / max(math.sqrt(max(var, 0.0)), self.min_std)
        return 1.0 if z <= 0.0 else upper_tail(z)

    def tail(self, raw: float) -> float:
        """Probability of recent raw scores at least this high, under the long-run fit."""
        tail = self._gauss_tail(self._average_with(raw), self._mean, self._var)
        if self.instant:
            tail = min(1.0, 2.0 * min(tail, self._gauss_tail(raw, self._raw_mean, self._raw_var)))
        return tail

    def score(self, raw: float) -> float:
        """Calibrated score of ``raw`` as the next raw score, without learning it."""
        if self._n < self.learning_period:
            return 0.0
        return log_tail_score(self.tail(raw))

    def learn(self, raw: float) -> None:
        """Append ``raw`` to the recent window and update the long-run fit."""
        avg = self._average_with(raw)
        self._recent = [*self._recent, raw][-self.short_window :]
        self._n += 1
        a = 1.0 / self._n if self._n <= self.learning_period else self._a
        self._mean, self._var = _ewm(avg, self._mean, self._var, a)
        self._raw_mean, self._raw_var = _ewm(raw, self._raw_mean, self._raw_var, a)

    def score_learn(self, raw: float) -> float:
        """Score, then learn: the streaming step."""
        s = self.score(raw)
        self.learn(raw)
        return s
