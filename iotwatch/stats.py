"""The one quantile definition every report uses (benchmarks, the demo, the evaluation, the
gateway's metrics): linear interpolation between the closest ranks, numpy's default, so
a p99 means the same thing in every table.

>>> quantile([1.0, 2.0, 3.0, 4.0], 0.5)
2.5
>>> quantiles([10, 20, 30], (0.5, 0.99))
{'p50': 20.0, 'p99': 29.8}
>>> quantile([], 0.5) is None
True
>>> rounded(2 / 3), rounded(None)
(0.6667, None)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def quantile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values``; None when there are none."""
    if len(values) == 0:
        return None
    return float(np.quantile(np.asarray(values, dtype=np.float64), q))


def quantiles(
    values: Sequence[float] | np.ndarray, qs: Iterable[float], digits: int | None = None
) -> dict[str, float | None]:
    """``{"p50": ..., "p99": ...}`` for the quantiles ``qs`` (one pass over ``values``),
    rounded to ``digits`` if given."""
    qs = tuple(qs)
    names = [f"p{q * 100:g}" for q in qs]
    if len(values) == 0:
        return dict.fromkeys(names)
    found = np.quantile(np.asarray(values, dtype=np.float64), qs)
    return {name: float(v) if digits is None else rounded(v, digits) for name, v in zip(names, found, strict=True)}


def rounded(value: float | None, digits: int = 4) -> float | None:
    """``value`` rounded to ``digits`` as a plain float (report figures); None stays None."""
    return None if value is None else round(float(value), digits)
