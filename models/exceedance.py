"""Peaks over threshold: how rare a deviation is *for this stream*, in a few numbers, so one
tail-probability threshold means about one false-alarm rate per reading on every stream
(docs/detection.md, "The shared views", has the model and its declustering).

The arithmetic is :func:`iotwatch.models.kernels.primitives.tail_tail` and
:func:`~iotwatch.models.kernels.primitives.tail_learn`, the functions the kernels of
``episode_likelihood`` and ``tail_ensemble`` call: this class holds one tail's state and
parameters and calls them one value at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from iotwatch.errors import UserError
from iotwatch.models.kernels.primitives import Floats, tail_learn, tail_tail
from iotwatch.models.numeric import decay_weight

__all__ = ["ExceedanceTail"]


@dataclass(eq=False, repr=False)
class ExceedanceTail:
    """Tail probability of a non-negative deviation, from the stream's own exceedances.

    Parameters
    ----------
    threshold
        ``u`` (> 0): deviations above it are exceedances.
    halflife
        Half-life of the exceedance rate, in readings.
    index_halflife
        Half-life of the tail index, in exceedances.
    prior_rate, prior_readings
        Prior exceedance rate and its weight in readings.
    prior_index, prior_peaks
        Prior tail index and its weight in exceedances.
    clip
        Log-excesses learned are clipped to ``clip`` times the current index.
    run_gap
        Exceedances fewer than this many readings apart belong to one cluster
        (0: every exceedance is its own cluster, learned at once).

    Examples
    --------
    >>> import random
    >>> rng = random.Random(5)
    >>> tail = ExceedanceTail()
    >>> for _ in range(20_000):
    ...     tail.learn(abs(rng.gauss(0, 1)))
    >>> tail.tail(2.0), 1e-5 < tail.tail(5.0) < 1e-3, tail.tail(10.0) < 1e-7
    (1.0, True, True)
    """

    threshold: float = 3.0
    halflife: float = 10_000.0
    index_halflife: float = 300.0
    prior_rate: float = 0.01
    prior_readings: float = 200.0
    prior_index: float = 0.25
    prior_peaks: float = 10.0
    clip: float = 4.0
    run_gap: int = 3

    def __post_init__(self) -> None:
        if self.threshold <= 0:
            raise UserError("threshold must be positive")
        self._a = decay_weight(self.halflife)
        self._b = decay_weight(self.index_halflife)
        #: The parameter tuple of :func:`~iotwatch.models.kernels.primitives.tail_learn`.
        self._params = (
            float(self.threshold),
            self._a,
            self._b,
            float(self.prior_readings),
            float(self.prior_peaks),
            float(self.clip),
            float(self.run_gap),
        )
        #: ``(readings, rate, peaks, index, readings since the last exceedance (up to run_gap),
        #: open cluster's peak (0: none open))``, the priors to start with.
        self._state: Floats = (0.0, self.prior_rate, 0.0, self.prior_index, float(self.run_gap), 0.0)

    def tail(self, d: float) -> float:
        """``P(deviation >= d)`` under the stream's fitted tail (1.0 at or below ``u``)."""
        return tail_tail(self._state, self._params, float(d))

    def learn(self, d: float) -> None:
        """Count one reading's deviation."""
        self._state = tail_learn(self._state, self._params, float(d))
