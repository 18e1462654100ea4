"""The one protocol every detector follows, and the small helpers detectors share.

A detector sees one reading at a time -- a mapping of metric name to float plus the
event time in epoch milliseconds -- and answers an anomaly score in ``[0, 1]`` (high means
anomalous). Scoring never changes the detector; learning does. The streaming job calls
:meth:`Detector.score_learn_one` once per reading, in event-time order per key.

*Per-device* detectors (``compact_state``) keep a few numbers per ``(device, metric)``
(:meth:`Detector.to_state`); *fleet* detectors, one model per device type, are saved whole
(:meth:`Detector.dumps`) in the registry (docs/detection.md, "Fleet models and the detector protocol").
"""

from __future__ import annotations

import abc
import inspect
import json
import math
import pickle
from collections.abc import Mapping
from typing import Any, ClassVar, Self

import numpy as np

from iotwatch.contract.detection import AnomalyKind

__all__ = [
    "ANOMALY_KINDS",
    "Detector",
    "Reading",
    "UnivariateMixin",
    "z_to_score",
]

#: A reading: metric name -> value. Missing metrics are simply absent.
Reading = Mapping[str, float]

#: The anomaly kinds of the contract; each detector lists those it claims in ``detects``.
ANOMALY_KINDS: frozenset[AnomalyKind] = frozenset(AnomalyKind)

#: Values are clipped to +-this before arithmetic, so squares never overflow.
VALUE_LIMIT = 1e100

#: Version of the JSON payload of :meth:`Detector.dumps` (read by :func:`iotwatch.models.catalog.load`).
PAYLOAD_FORMAT = 1


def z_to_score(z: float, half: float = 4.0) -> float:
    """Map a deviation ``|z|`` (in robust standard deviations) to ``[0, 1)``.

    ``z**2 / (z**2 + half**2)``: smooth and monotone, ``half`` sigmas score 0.5, 2x
    ``half`` scores 0.8. Non-finite input scores 1.0.

    >>> [round(z_to_score(z), 3) for z in (0.0, 2.0, 4.0, 8.0, float("inf"))]
    [0.0, 0.2, 0.5, 0.8, 1.0]
    """
    if not math.isfinite(z):
        return 1.0
    z2 = z * z
    return z2 / (z2 + half * half)


class Detector(abc.ABC):
    """An online anomaly detector: learn from and score readings, one at a time.

    Subclasses set the class attributes, store every constructor argument under an
    attribute of the same name (so :meth:`get_params` and :meth:`clone` work), and
    implement :meth:`learn_one`, :meth:`score_one` and, when ``compact_state``,
    :meth:`to_state` / :meth:`set_state`.
    """

    #: Its name in :data:`iotwatch.models.catalog.DETECTORS`, also the key in serialised payloads.
    name: ClassVar[str] = ""
    #: True when the whole learned state is a few numbers (per-device state store).
    compact_state: ClassVar[bool] = True
    #: Anomaly kinds (from :data:`ANOMALY_KINDS`) this detector is built to flag.
    detects: ClassVar[frozenset[AnomalyKind]] = frozenset()

    # --- the protocol ---------------------------------------------------------------

    @abc.abstractmethod
    def learn_one(self, x: Reading, t_ms: int) -> None:
        """Update the detector with one reading (event time ``t_ms``, epoch ms)."""

    @abc.abstractmethod
    def score_one(self, x: Reading, t_ms: int) -> float:
        """Anomaly score of one reading in ``[0, 1]``, without learning from it."""

    def surprise_one(self, x: Reading, t_ms: int) -> float:
        """How surprising one reading is, without learning from it: its score before any
        one-alarm-per-episode hold (a held detector scores 0 while an episode goes on, though
        the reading may be as surprising as the one that began it). Without a hold: the score."""
        return self.score_one(x, t_ms)

    def declare(self, low: float | None = None, high: float | None = None, probation: int | None = None) -> Self:
        """Tell a fresh detector what is known before its first reading: the metric's value
        range (``low``, ``high``) and the readings it may learn from before it is judged
        (``probation``). NAB's base detector gives every detector its stream's minimum,
        maximum and 15 % of its rows (``inputMin``, ``inputMax``, ``probationaryPeriod``);
        an operator may declare a metric's normal range. A detector that cannot use them
        ignores them (this default); none is told anything else in advance."""
        return self

    def warmup_readings(self) -> int:
        """Readings this detector learns from before its scores mean anything (it scores 0
        until then), so tools can warn about a stream shorter than that."""
        return int(getattr(self, "warmup", 0))

    def state_limit_bytes(self) -> int:
        """The most bytes :meth:`to_state`'s JSON takes, whatever the stream: a few numbers
        for most detectors; more for one whose memory is capped by a parameter."""
        return 4096

    def score_learn_one(self, x: Reading, t_ms: int) -> float:
        """Score a reading, then learn from it: the streaming step (no look-ahead)."""
        score = self.score_one(x, t_ms)
        self.learn_one(x, t_ms)
        return score

    def score_learn_many(self, values: np.ndarray, t_ms: np.ndarray, metrics: list[str]) -> np.ndarray:
        """:meth:`score_learn_one` over a batch in order; ``values`` is ``(n, len(metrics))``.

        The result equals the row-by-row loop exactly; fleet detectors override this with
        a vectorised equivalent. NaN marks a missing metric.
        """
        values = np.asarray(values, dtype=float).reshape(len(t_ms), len(metrics))
        out = np.empty(len(t_ms))
        for i, (row, t) in enumerate(zip(values.tolist(), np.asarray(t_ms).tolist(), strict=True)):
            reading = {m: v for m, v in zip(metrics, row, strict=True) if not math.isnan(v)}
            out[i] = self.score_learn_one(reading, int(t))
        return out

    # --- parameters -----------------------------------------------------------------

    def get_params(self) -> dict[str, Any]:
        """Constructor arguments, read back from the attributes of the same names."""
        sig = inspect.signature(type(self).__init__)
        return {p: getattr(self, p) for p in sig.parameters if p != "self"}

    def clone(self) -> Self:
        """A fresh, untrained detector with the same parameters."""
        return type(self)(**self.get_params())

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    # --- state ----------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """The learned state as a small JSON-able dict (numbers and lists of numbers)."""
        raise NotImplementedError(f"{self.name} is a fleet model: save it with dumps()")

    def set_state(self, state: Mapping[str, Any]) -> Self:
        """Restore what :meth:`to_state` returned (into a detector with the same params)."""
        raise NotImplementedError(f"{self.name} is a fleet model: load it with iotwatch.models.catalog.load()")

    def dumps(self) -> bytes:
        """Serialise the whole detector: JSON for compact state, pickle for fleet models."""
        if self.compact_state:
            doc = {
                "format": PAYLOAD_FORMAT,
                "detector": self.name,
                "params": self.get_params(),
                "state": self.to_state(),
            }
            return json.dumps(doc, separators=(",", ":"), allow_nan=True).encode()
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)


class UnivariateMixin:
    """Picks the one value a single-metric detector looks at.

    With ``metric=None`` the reading must hold exactly one metric; otherwise the named
    metric is used. A missing or non-finite value yields ``None`` (score 0, no learning).
    """

    metric: str | None

    def _value(self, x: Reading) -> float | None:
        v: float | None
        if self.metric is None:
            if len(x) != 1:
                return None
            v = next(iter(x.values()))
        else:
            v = x.get(self.metric)
            if v is None:
                return None
        v = float(v)
        if v - v != 0.0:  # NaN or infinite (the hot path: cheaper than math.isfinite)
            return None
        return v if -VALUE_LIMIT <= v <= VALUE_LIMIT else math.copysign(VALUE_LIMIT, v)
