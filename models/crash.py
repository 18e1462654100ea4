"""The crash condition: a vehicle's longitudinal deceleration beyond a threshold."""

from __future__ import annotations

from typing import overload

import numpy as np

__all__ = ["is_crash"]


@overload
def is_crash(accel_x_g: float, threshold_g: float) -> bool: ...
@overload
def is_crash(accel_x_g: np.ndarray, threshold_g: float) -> np.ndarray: ...
def is_crash(accel_x_g: float | np.ndarray, threshold_g: float) -> bool | np.ndarray:
    """Whether a longitudinal acceleration (g, positive forward) is a deceleration of at
    least ``threshold_g``: the job's crash rule (event data recorders trigger around 4-8 g;
    hard braking stays near 1 g). NaN (no reading) is no crash.

    >>> is_crash(-4.0, 4.0), is_crash(np.array([-0.9, -12.5, np.nan]), 4.0).tolist()
    (True, [False, True, False])
    """
    with np.errstate(invalid="ignore"):
        crashed = -np.asarray(accel_x_g, dtype=float) >= threshold_g
    return crashed if isinstance(accel_x_g, np.ndarray) else bool(crashed)
