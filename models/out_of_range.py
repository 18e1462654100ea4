"""Rule: a value outside its physical limits."""

from __future__ import annotations

from typing import ClassVar

from models.base import Detector, Reading, StatelessMixin, UnivariateMixin

__all__ = ["OutOfRange"]


class OutOfRange(StatelessMixin, UnivariateMixin, Detector):
    """Score 1.0 when the value leaves ``[low, high]`` (inclusive), else 0.0.

    Limits are physical facts of the sensor (a thermostat cannot read -80 degC), given as
    parameters; the rule learns nothing, so its state is empty.

    Parameters
    ----------
    metric
        Metric to check; ``None`` means the reading's only metric.
    low, high
        Inclusive limits; ``None`` leaves that side open.

    Examples
    --------
    >>> rule = OutOfRange(metric="temperature_c", low=-40.0, high=85.0)
    >>> [rule.score_one({"temperature_c": v}, 0) for v in (21.5, 85.0, 120.0, -41.0)]
    [0.0, 0.0, 1.0, 1.0]
    """

    name: ClassVar[str] = "out_of_range"
    detects: ClassVar[frozenset[str]] = frozenset({"out_of_range"})

    def __init__(self, metric: str | None = None, low: float | None = None, high: float | None = None) -> None:
        if low is not None and high is not None and low > high:
            raise ValueError(f"low {low} > high {high}")
        self.metric = metric
        self.low = low
        self.high = high

    def score_one(self, x: Reading, t_ms: int) -> float:
        v = self._value(x)
        if v is None:
            return 0.0
        if (self.low is not None and v < self.low) or (self.high is not None and v > self.high):
            return 1.0
        return 0.0
