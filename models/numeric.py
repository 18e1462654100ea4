"""Numeric primitives the detectors share: written once, run as plain Python by the detectors
without a kernel and compiled into the kernels (:mod:`iotwatch.models.kernels.primitives`),
so both compute the same floats."""

from __future__ import annotations

import math

__all__ = ["decay_weight", "log_tail_score", "upper_tail"]


def decay_weight(halflife: float) -> float:
    """Per-reading weight of an exponential average whose weights halve every ``halflife``
    readings.

    >>> decay_weight(1.0), round(decay_weight(100.0), 6)
    (0.5, 0.006908)
    """
    halving: float = 0.5 ** (1.0 / max(halflife, 1e-9))
    return 1.0 - halving


def upper_tail(z: float) -> float:
    """P(Z >= z) for a standard normal Z.

    >>> upper_tail(0.0), f"{upper_tail(3.0):.5f}"
    (0.5, '0.00135')
    """
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def log_tail_score(tail: float) -> float:
    """Log scale of a tail probability, in ``[0, 1)``: 0.5 at 1e-5 (``L / (L + 5)``,
    ``L = -log10(tail)``). Comparisons written out as Python's ``max``/``min`` make them,
    so the compiled function gives the same floats.

    >>> [round(log_tail_score(p), 3) for p in (1.0, 1e-2, 1e-5, 1e-10, 1e-40, 0.0)]
    [0.0, 0.286, 0.5, 0.667, 0.889, 0.984]
    """
    floored = 1e-300 if 1e-300 > tail else tail
    capped = 1.0 if 1.0 < floored else floored
    decades = -math.log10(capped)
    decades = decades if decades > 0.0 else 0.0
    return decades / (decades + 5.0)
