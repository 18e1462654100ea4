"""Rule: a vehicle's longitudinal deceleration beyond a crash threshold."""

from __future__ import annotations

from typing import ClassVar

from models.base import Detector, Reading, StatelessMixin, UnivariateMixin

__all__ = ["CrashDeceleration", "STANDARD_GRAVITY"]

#: m/s^2 per g.
STANDARD_GRAVITY = 9.80665


class CrashDeceleration(StatelessMixin, UnivariateMixin, Detector):
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
    >>> [rule.score_one({"accel_x_g": a}, 0) for a in (0.3, -0.9, -4.0, -12.5, 6.0)]
    [0.0, 0.0, 1.0, 1.0, 0.0]
    """

    name: ClassVar[str] = "crash"
    detects: ClassVar[frozenset[str]] = frozenset({"crash"})

    def __init__(self, metric: str | None = "accel_x_g", threshold_g: float = 4.0, units: str = "g") -> None:
        if units not in ("g", "m/s2"):
            raise ValueError(f"units must be 'g' or 'm/s2', not {units!r}")
        if threshold_g <= 0:
            raise ValueError("threshold_g must be positive")
        self.metric = metric
        self.threshold_g = threshold_g
        self.units = units

    def score_one(self, x: Reading, t_ms: int) -> float:
        v = self._value(x)
        if v is None:
            return 0.0
        decel_g = -v / STANDARD_GRAVITY if self.units == "m/s2" else -v
        return 1.0 if decel_g >= self.threshold_g else 0.0
