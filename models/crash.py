"""Rule: a vehicle's longitudinal deceleration beyond a crash threshold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

from models.base import Detector, Reading, UnivariateMixin

__all__ = ["CrashDeceleration", "STANDARD_GRAVITY"]

#: m/s^2 per g.
STANDARD_GRAVITY = 9.80665


class CrashDeceleration(UnivariateMixin, Detector):
    """Score 1.0 when longitudinal deceleration reaches ``threshold_g``.

    The metric is longitudinal acceleration (positive forward), in g or, with
    ``units="m/s2"``, in metres per second squared; deceleration is its negative. Event
    data recorders typically trigger around 4-8 g; hard braking stays near 1 g.

    Parameters
    ----------
    metric
        Longitudinal acceleration metric; ``None`` means the reading's only metric.
    threshold_g
        Deceleration, in g, that counts as a crash.
    units
        ``"g"`` or ``"m/s2"``.

    Examples
    --------
    >>> rule = CrashDeceleration(threshold_g=4.0)
    >>> [rule.score_one({"accel_long_g": a}, 0) for a in (0.3, -0.9, -4.0, -12.5, 6.0)]
    [0.0, 0.0, 1.0, 1.0, 0.0]
    """

    name: ClassVar[str] = "crash"
    detects: ClassVar[frozenset[str]] = frozenset({"crash"})

    def __init__(self, metric: str | None = "accel_long_g", threshold_g: float = 4.0, units: str = "g") -> None:
        if units not in ("g", "m/s2"):
            raise ValueError(f"units must be 'g' or 'm/s2', not {units!r}")
        if threshold_g <= 0:
            raise ValueError("threshold_g must be positive")
        self.metric = metric
        self.threshold_g = threshold_g
        self.units = units

    def to_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: Mapping[str, Any]) -> Self:
        return self

    def score_one(self, x: Reading, t_ms: int) -> float:
        v = self._value(x)
        if v is None:
            return 0.0
        decel_g = -v / STANDARD_GRAVITY if self.units == "m/s2" else -v
        return 1.0 if decel_g >= self.threshold_g else 0.0

    def learn_one(self, x: Reading, t_ms: int) -> None:
        return None
