"""Rule: a vehicle's longitudinal deceleration beyond a crash threshold."""

from __future__ import annotations

from typing import ClassVar, overload

import numpy as np

from iotwatch.contract.detection import AnomalyKind
from iotwatch.errors import UserError
from iotwatch.models.base import Detector, Reading, StatelessMixin, UnivariateMixin

__all__ = ["CrashDeceleration", "STANDARD_GRAVITY", "is_crash"]

#: m/s^2 per g.
STANDARD_GRAVITY = 9.80665


@overload
def is_crash(accel_x_g: float, threshold_g: float) -> bool: ...
@overload
def is_crash(accel_x_g: np.ndarray, threshold_g: float) -> np.ndarray: ...
def is_crash(accel_x_g: float | np.ndarray, threshold_g: float) -> bool | np.ndarray:
    """Whether a longitudinal acceleration (g, positive forward) is a deceleration of at
    least ``threshold_g``: the crash condition of this detector and of the job's crash rule.
    NaN (no reading) is no crash.

    >>> is_crash(-4.0, 4.0), is_crash(np.array([-0.9, -12.5, np.nan]), 4.0).tolist()
    (True, [False, True, False])
    """
    with np.errstate(invalid="ignore"):
        crashed = -np.asarray(accel_x_g, dtype=float) >= threshold_g
    return crashed if isinstance(accel_x_g, np.ndarray) else bool(crashed)


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
    detects: ClassVar[frozenset[AnomalyKind]] = frozenset({AnomalyKind.CRASH})

    def __init__(self, metric: str | None = "accel_x_g", threshold_g: float = 4.0, units: str = "g") -> None:
        if units not in ("g", "m/s2"):
            raise UserError(f"units must be 'g' or 'm/s2', not {units!r}")
        if threshold_g <= 0:
            raise UserError("threshold_g must be positive")
        self.metric = metric
        self.threshold_g = threshold_g
        self.units = units

    def score_one(self, x: Reading, t_ms: int) -> float:
        v = self._value(x)
        if v is None:
            return 0.0
        accel_g = v / STANDARD_GRAVITY if self.units == "m/s2" else v
        return 1.0 if is_crash(accel_g, self.threshold_g) else 0.0
