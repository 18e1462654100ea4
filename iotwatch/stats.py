"""The one quantile definition every report uses (benchmarks, the demo, the evaluation, the
gateway's metrics): linear interpolation between the closest ranks, numpy's default, so
a p99 means the same thing in every table.

>>> quantile([1.0, 2.0, 3.0, 4.0], 0.5)
2.5
>>> quantiles([10, 20, 30], (0.5, 0.99))
{'p50': 20.0, 'p99': 29.8}
>>> quantile([], 0.5) is None
True
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
    """``{"p50": ..., "p99": ...}`` for the quantiles ``qs``, rounded to ``digits`` if given."""

    def rounded(value: float | None) -> float | None:
        return value if value is None or digits is None else round(value, digits)

    return {f"p{q * 100:g}": rounded(quantile(values, q)) for q in qs}
