"""Stuck sensors: a run of identical readings on a stream that rarely repeats itself.

The arithmetic is :func:`iotwatch.models.kernels.primitives.repeat_tail` and
:func:`~iotwatch.models.kernels.primitives.repeat_learn`, the functions the kernels of
``episode_likelihood`` and ``tail_ensemble`` call for their *stuck* view."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from iotwatch.contract.detection import AnomalyKind
from iotwatch.models.base import Detector, Reading, UnivariateMixin
from iotwatch.models.kernels.primitives import (
    Floats,
    log_tail_score,
    repeat_learn,
    repeat_tail,
)
from iotwatch.models.numeric import decay_weight

__all__ = ["RepeatRun"]


@dataclass(eq=False, repr=False)
class RepeatRun(UnivariateMixin, Detector):
    """How improbable the current run of identical readings is, given how often this
    stream repeats a reading.

    The repeat rate ``r`` is learned per stream; ``m`` repeats in a row have the tail
    ``r ** m``. Streams that repeat by nature, or whose changes are not noise, are not
    judged (docs/detection.md, "The shared views").

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

    metric: str | None = None
    tolerance: float = 0.0
    halflife: float = 2000.0
    prior_rate: float = 0.3
    prior_readings: float = 30.0
    max_repeat_rate: float = 0.2
    min_reversals: float = 0.3

    def __post_init__(self) -> None:
        self._a = decay_weight(self.halflife)
        #: The parameter tuple of :func:`~iotwatch.models.kernels.primitives.repeat_learn`.
        self._params = (
            float(self.tolerance),
            self._a,
            float(self.prior_readings),
            float(self.max_repeat_rate),
            float(self.min_reversals),
        )
        self.set_state({})

    def to_state(self) -> dict[str, Any]:
        n, rate, last, run, reversals, direction = self._state
        return {
            "n": int(n),
            "rate": rate,
            "last": None if math.isnan(last) else last,
            "run": int(run),
            "reversals": reversals,
            "direction": int(direction),
        }

    def set_state(self, state: Mapping[str, Any]) -> Self:
        last = state.get("last")
        #: ``(readings, repeat rate, last value (NaN: none), run, reversal rate, sign of the last change)``.
        self._state: Floats = (
            float(int(state.get("n", 0))),
            float(state.get("rate", self.prior_rate)),
            math.nan if last is None else float(last),
            float(int(state.get("run", 0))),
            float(state.get("reversals", 0.0)),
            float(int(state.get("direction", 0))),
        )
        return self

    def tail(self, x: Reading, t_ms: int) -> float:
        """Probability of a run at least this long, were repeats independent at the stream's rate."""
        v = self._value(x)
        return 1.0 if v is None else repeat_tail(self._state, self._params, v)

    def score_one(self, x: Reading, t_ms: int) -> float:
        return log_tail_score(self.tail(x, t_ms))

    def learn_one(self, x: Reading, t_ms: int) -> None:
        v = self._value(x)
        if v is not None:
            self._state = repeat_learn(self._state, self._params, v)
