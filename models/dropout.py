"""Rule: a gap in event time much longer than the device's usual reporting interval."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

from models.base import Detector, Reading

__all__ = ["Dropout"]


class Dropout(Detector):
    """Score 1.0 for the first reading after a gap longer than ``k`` expected intervals.

    The expected interval is ``expected_interval_ms`` when given, otherwise learned as an
    exponentially weighted average of recent gaps (a dropout's own gap is not learned).
    A dropout is only *known* when the next reading arrives; a streaming job that must
    alarm during the silence calls :meth:`overdue` from a state timeout. Any reading
    counts, whatever its metrics.

    Parameters
    ----------
    k
        Gap, in expected intervals, that counts as a dropout.
    expected_interval_ms
        Fixed reporting interval; ``None`` learns it.
    halflife
        Half-life, in gaps, of the learned interval.
    warmup
        Gaps to learn before judging (when the interval is learned).

    Examples
    --------
    >>> rule = Dropout(k=3.0, expected_interval_ms=60_000)
    >>> [rule.score_learn_one({"v": 1.0}, t) for t in (0, 60_000, 120_000, 600_000, 660_000)]
    [0.0, 0.0, 0.0, 1.0, 0.0]
    >>> rule.overdue(1_000_000)
    True
    """

    name: ClassVar[str] = "dropout"
    detects: ClassVar[frozenset[str]] = frozenset({"dropout"})

    def __init__(
        self, k: float = 5.0, expected_interval_ms: float | None = None, halflife: float = 50.0, warmup: int = 5
    ) -> None:
        self.k = k
        self.expected_interval_ms = expected_interval_ms
        self.halflife = halflife
        self.warmup = warmup
        self._a = 1.0 - 0.5 ** (1.0 / max(halflife, 1e-9))
        self.set_state({})

    def to_state(self) -> dict[str, Any]:
        return {"last_ms": self._last, "interval_ms": self._interval, "gaps": self._gaps}

    def set_state(self, state: Mapping[str, Any]) -> Self:
        last = state.get("last_ms")
        self._last = None if last is None else int(last)
        self._interval = float(state.get("interval_ms", 0.0))
        self._gaps = int(state.get("gaps", 0))
        return self

    def expected_interval(self) -> float | None:
        """The interval readings are expected at, or ``None`` while still learning it."""
        if self.expected_interval_ms is not None:
            return float(self.expected_interval_ms)
        return self._interval if self._gaps >= self.warmup and self._interval > 0 else None

    def overdue(self, now_ms: int) -> bool:
        """True when no reading has arrived for more than ``k`` expected intervals."""
        interval = self.expected_interval()
        return self._last is not None and interval is not None and now_ms - self._last > self.k * interval

    def score_one(self, x: Reading, t_ms: int) -> float:
        return 1.0 if self.overdue(t_ms) else 0.0

    def learn_one(self, x: Reading, t_ms: int) -> None:
        if self._last is not None and t_ms > self._last:
            gap = float(t_ms - self._last)
            if not self.overdue(t_ms):
                self._gaps += 1
                a = 1.0 / self._gaps if self._gaps <= self.warmup else self._a
                self._interval += a * (gap - self._interval)
        if self._last is None or t_ms > self._last:
            self._last = int(t_ms)
