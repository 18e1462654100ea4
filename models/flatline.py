"""Rule: a sensor stuck at one value."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

from iotwatch.contract.detection import AnomalyKind
from iotwatch.errors import UserError
from iotwatch.models.base import Detector, Reading, UnivariateMixin

__all__ = ["Flatline"]


class Flatline(UnivariateMixin, Detector):
    """Score 1.0 once ``count`` consecutive readings are equal (within ``tolerance``).

    The run is measured against the first reading of the run, so a slow creep of tiny
    steps does not count as stuck. The state is the run's value and length.

    Parameters
    ----------
    metric
        Metric to watch; ``None`` means the reading's only metric.
    count
        Identical readings (including the scored one) that make a flatline.
    tolerance
        Largest absolute difference still counted as identical.

    Examples
    --------
    >>> rule = Flatline(count=4)
    >>> [rule.score_learn_one({"v": v}, i) for i, v in enumerate([1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 3.0])]
    [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    """

    name: ClassVar[str] = "flatline"
    detects: ClassVar[frozenset[AnomalyKind]] = frozenset({AnomalyKind.FLATLINE})

    def __init__(self, metric: str | None = None, count: int = 30, tolerance: float = 0.0) -> None:
        if count < 2:
            raise UserError("count must be at least 2")
        self.metric = metric
        self.count = count
        self.tolerance = tolerance
        self.set_state({})

    def to_state(self) -> dict[str, Any]:
        return {"value": self._value_run, "run": self._run}

    def set_state(self, state: Mapping[str, Any]) -> Self:
        value = state.get("value")
        self._value_run = None if value is None else float(value)
        self._run = int(state.get("run", 0))
        return self

    def _same(self, v: float) -> bool:
        return self._value_run is not None and abs(v - self._value_run) <= self.tolerance

    def score_one(self, x: Reading, t_ms: int) -> float:
        v = self._value(x)
        if v is None or not self._same(v):
            return 0.0
        return 1.0 if self._run + 1 >= self.count else 0.0

    def learn_one(self, x: Reading, t_ms: int) -> None:
        v = self._value(x)
        if v is None:
            return
        if self._same(v):
            self._run += 1
        else:
            self._value_run, self._run = v, 1
