"""Stuck sensors: a run of identical readings on a stream that rarely repeats itself."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from iotwatch.contract.detection import AnomalyKind
from iotwatch.models.base import Detector, Reading, UnivariateMixin
from iotwatch.models.likelihood import log_tail_score
from iotwatch.models.numeric import decay_weight

__all__ = ["RepeatRun"]


class RepeatRun(UnivariateMixin, Detector):
    """How improbable the current run of identical readings is, given how often this
    stream repeats a reading.

    The stream's repeat rate ``r`` (a reading equal to the one before, within
    ``tolerance``) is an exponentially weighted mean with a prior; if repeats were
    independent, ``m`` repeats in a row have probability ``r ** m``, which is the tail
    this detector reports. A noisy sensor that almost never repeats (``r`` = 0.02) is
    suspicious after four repeats. Two kinds of stream are not judged, because there runs
    are normal and not independent: streams that repeat often by nature (a setpoint, a
    battery level: ``r`` above ``max_repeat_rate``), and streams whose changes are not
    noise -- a smooth signal (an outdoor temperature holds still at its daily peak) or a
    level that only falls or rises (a fuel gauge, still while the vehicle is parked). Noise
    reverses the direction of change about every other reading; the stream is judged only
    while its rate of reversals (an exponentially weighted mean over changes) is at least
    ``min_reversals``. The fixed-count :class:`iotwatch.models.flatline.Flatline` rule is the
    alternative when the count is known.

    Parameters
    ----------
    metric
        Metric to watch; ``None`` means the reading's only metric.
    tolerance
        Largest absolute difference still counted as identical.
    halflife
        Half-life of the repeat rate, in readings.
    prior_rate, prior_readings
        Prior repeat rate and its weight in readings.
    max_repeat_rate
        Streams repeating more often than this are not judged.
    min_reversals
        Streams whose changes reverse direction less often than this are not judged.

    Examples
    --------
    >>> import random
    >>> rng = random.Random(2)
    >>> det = RepeatRun()
    >>> for i in range(3000):
    ...     det.learn_one({"t": round(20 + rng.gauss(0, 0.2), 2)}, i)
    >>> scores = [det.score_learn_one({"t": 21.0}, 3000 + i) for i in range(8)]
    >>> scores[1] < 0.3 < 0.5 < scores[-1]
    True
    >>> flat = RepeatRun()
    >>> max(flat.score_learn_one({"battery": 83.5}, i) for i in range(500))
    0.0
    """

    name: ClassVar[str] = "repeat_run"
    detects: ClassVar[frozenset[AnomalyKind]] = frozenset({AnomalyKind.FLATLINE})

    def __init__(
        self,
        metric: str | None = None,
        tolerance: float = 0.0,
        halflife: float = 2000.0,
        prior_rate: float = 0.3,
        prior_readings: float = 30.0,
        max_repeat_rate: float = 0.2,
        min_reversals: float = 0.3,
    ) -> None:
        self.metric = metric
        self.tolerance = tolerance
        self.halflife = halflife
        self.prior_rate = prior_rate
        self.prior_readings = prior_readings
        self.max_repeat_rate = max_repeat_rate
        self.min_reversals = min_reversals
        self._a = decay_weight(halflife)
        self.set_state({})

    def to_state(self) -> dict[str, Any]:
        return {
            "n": self._n,
            "rate": self._rate,
            "last": self._last,
            "run": self._run,
            "reversals": self._reversals,
            "direction": self._direction,
        }

    def set_state(self, state: Mapping[str, Any]) -> Self:
        self._n = int(state.get("n", 0))
        self._rate = float(state.get("rate", self.prior_rate))
        last = state.get("last")
        self._last = None if last is None else float(last)
        self._run = int(state.get("run", 0))
        self._reversals = float(state.get("reversals", 0.0))
        self._direction = int(state.get("direction", 0))  # sign of the last change
        return self

    def judged(self) -> bool:
        """Whether runs on this stream say anything (see the class notes)."""
        return self._rate <= self.max_repeat_rate and self._reversals >= self.min_reversals

    def run_length(self, x: Reading) -> int | None:
        """Repeats of the previous reading ending with this one (0: it differs)."""
        v = self._value(x)
        if v is None:
            return None
        return self._run + 1 if self._last is not None and abs(v - self._last) <= self.tolerance else 0

    def tail(self, x: Reading, t_ms: int) -> float:
        """Probability of a run at least this long, were repeats independent at the stream's rate."""
        run = self.run_length(x)
        if not run or not self.judged():
            return 1.0
        return math.exp(run * math.log(max(self._rate, 1e-6)))

    def score_one(self, x: Reading, t_ms: int) -> float:
        return log_tail_score(self.tail(x, t_ms))

    def learn_one(self, x: Reading, t_ms: int) -> None:
        run = self.run_length(x)
        if run is None:
            return
        v = self._value(x)
        if self._last is not None and v is not None:
            self._n += 1
            a = max(1.0 / (self._n + self.prior_readings), self._a)
            self._rate += a * ((1.0 if run else 0.0) - self._rate)
            if run == 0:
                direction = 1 if v > self._last else -1
                if self._direction:
                    self._reversals += a * ((1.0 if direction != self._direction else 0.0) - self._reversals)
                self._direction = direction
        self._run = run
        self._last = v
