"""The Contextual Anomaly Detector, open-source edition (CAD OSE), as NAB publishes it.

CAD OSE (M. Smirnov, NAB v1.1 entry ``contextOSE``, 69.9 on the whole corpus, standard
profile) reads a stream as a sequence of *facts*: each reading is cut into
``value_bits`` bits over a fixed value range, each bit a fact. A *context* pairs a left
semi-context (facts of the previous step: its bits and the contexts fully active then, as
"neurons") with a right semi-context (facts of the step after). Each step updates the
contexts whose left side the previous step held and scores the reading by the share of
them whose right side did not come true and the share of candidate contexts it had to
learn. After a score of ``base_threshold`` or more it keeps quiet for ``rest_period``
readings.

The arithmetic is one compiled kernel (:mod:`iotwatch.models.kernels.cad_ose`); this
module runs it as NAB does (:func:`nab_scores`) and as a catalogued detector on a stream
(:class:`CadOse`). docs/detection.md ("A reproduced NAB leader") has the figures, what the
exact reproduction owes to Python 2, and the ``max_contexts`` cap on its memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from iotwatch.contract.detection import AnomalyKind
from iotwatch.models.kernels import Kernel, KernelDetector
from iotwatch.models.kernels import cad_ose as kernel

__all__ = ["CadOse", "nab_scores"]


def nab_scores(
    values: Sequence[float] | np.ndarray,
    probationary_percent: float = 0.15,
    max_contexts: int | None = None,
    **params: Any,
) -> np.ndarray:
    """CAD OSE run as NAB runs it on one stream: the range is the stream's own minimum and
    maximum (no margin, never widened), the rest period a fifth of the probationary ``floor(0.15 n)``
    readings, and the context memory unbounded unless ``max_contexts`` caps it. ``params``: the other
    parameters of :class:`CadOse` (``base_threshold``, ``value_bits``, ...)."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    rest = min(math.floor(probationary_percent * n), probationary_percent * 5000) / 5.0
    vector = kernel.params_vector(CadOse(rest_period=int(rest), **{"margin": 0.0, "widen_range": False, **params}))
    scores, _ = kernel.given_range_scores(values, float(values.min()), float(values.max()), vector, max_contexts)
    return scores


@dataclass(eq=False, repr=False)
class CadOse(KernelDetector):
    """CAD OSE on a stream: the published algorithm over a value range the stream sets as
    it goes, its context memory capped.

    A stream has no minimum and maximum beforehand: its first ``range_readings`` readings
    set the range, ``margin`` of its span added each side, and a reading beyond it
    (``widen_range``) scores 1, widens the range and starts the memory again
    (docs/detection.md has the why and the figures of the defaults, chosen on nab-dev's
    tuning half). ``max_contexts`` bounds the state: one row of
    :mod:`iotwatch.models.kernels.cad_ose`. CAD OSE scores by learning, so ``score_one``
    learns on a copy of the 264 KB row; the streaming step is ``score_learn_one``.
    """

    name: ClassVar[str] = "cad_ose"
    _kernel: ClassVar[Kernel[Any]] = kernel
    #: None claimed: on the generated test streams (``tests/support/streams.py``) its clean
    #: scores reach those of the anomalies; it is measured on NAB instead.
    detects: ClassVar[frozenset[AnomalyKind]] = frozenset()

    metric: str | None = None
    range_readings: int = 50
    margin: float = 0.5
    rest_period: int = 30
    base_threshold: float = 0.75
    max_left_length: int = 7
    max_active_neurons: int = 15
    value_bits: int = 3
    max_contexts: int = 1024
    widen_range: bool = True

    def warmup_readings(self) -> int:
        return self.range_readings + self.rest_period

    def state_limit_bytes(self) -> int:
        """The row as JSON: each number at most 24 characters and its separator."""
        return 64 + 26 * kernel.STATE_SIZE
