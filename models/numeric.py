"""Numeric primitives the detectors share: written once, run by the reference detectors as
plain Python and compiled into their kernels (:mod:`iotwatch.models.kernels.primitives`), so both
compute the same floats."""

from __future__ import annotations

import math

__all__ = ["decay_weight", "upper_tail"]


def decay_weight(halflife: float) -> float:
    """Per-reading weight of an exponential average whose weights halve every ``halflife``
    readings.

    >>> decay_weight(1.0), round(decay_weight(100.0), 6)
    (0.5, 0.006908)
    """
    return 1.0 - 0.5 ** (1.0 / max(halflife, 1e-9))


def upper_tail(z: float) -> float:
    """P(Z >= z) for a standard normal Z.

    >>> upper_tail(0.0), f"{upper_tail(3.0):.5f}"
    (0.5, '0.00135')
    """
    return 0.5 * math.erfc(z / math.sqrt(2.0))
