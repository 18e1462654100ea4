"""The per-reading detectors' arithmetic, compiled: one kernel a detector, for the streaming
hot path and for the detector's own class.

A kernel scores a whole micro-batch of interleaved streams in one numba call, with every
stream's state one row of a float64 array: no Python object per reading, so a reading
costs arithmetic only. Its detector class (:mod:`iotwatch.models`) is a thin wrapper: its
state is one such row and each ``score_learn_one`` is the same compiled step on a batch of
one reading. Numeric pieces the kernels share live in :mod:`.primitives`. With numba's JIT
disabled (``NUMBA_DISABLE_JIT=1``) the same code runs as plain Python, to read and step
through; ``tests/unit/models/test_detector_kernels.py`` holds both runs to scores pinned on
the NAB sample.

:func:`iotwatch.models.catalog.kernel_for` finds the kernel of a detector by name, through
the detector's class (no kernel imports the catalogue); the streaming engine runs it through
the small :class:`Kernel` protocol.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, TypeVar

import numpy as np

from iotwatch.models.base import Detector, Reading, UnivariateMixin

if TYPE_CHECKING:  # not at run time: importing primitives imports numba
    from iotwatch.models.kernels.primitives import FloatArray, IntArray

__all__ = ["Kernel", "KernelDetector", "warm_kernel"]


#: The detector class a kernel reads its parameters from.
D_contra = TypeVar("D_contra", bound=Detector, contravariant=True)


class Kernel(Protocol[D_contra]):
    """What the streaming engine needs of a kernel module: the size of a stream's state row,
    the parameter vector read from its detector (``Kernel[CadOse]``), a fresh row, the batch
    step (also giving each reading's surprise before the hold,
    :meth:`iotwatch.models.base.Detector.surprise_one`).

    One step takes a whole micro-batch, many streams interleaved, each stream's readings in
    order among themselves: ``states`` ``(n_streams, STATE_SIZE)`` float64, ``stream`` int64
    row indices, ``values`` float64, ``t_ms`` int64 event times, ``params`` from
    ``params_vector``, ``surprise`` as long as the batch or empty (no surprises kept).
    C-contiguous arrays of these dtypes run the code :func:`warm_kernel` compiled (others
    compile a variant on first use)."""

    STATE_SIZE: int

    def params_vector(self, detector: D_contra) -> FloatArray: ...

    def initial_state(self, params: FloatArray) -> FloatArray: ...

    def score_learn(
        self, states: FloatArray, stream: IntArray, values: FloatArray, t_ms: IntArray, params: FloatArray
    ) -> FloatArray: ...

    def score_learn_into(
        self,
        states: FloatArray,
        stream: IntArray,
        values: FloatArray,
        t_ms: IntArray,
        params: FloatArray,
        surprise: FloatArray,
    ) -> FloatArray: ...


#: The stream index of a :class:`KernelDetector`'s one row.
_ROW0 = np.zeros(1, dtype=np.int64)


class KernelDetector(UnivariateMixin, Detector):
    """A per-reading detector that is its kernel: its state is one row of the kernel's
    states and every call runs the kernel's step on a batch of one reading (on a copy of
    the row when it must not learn). A subclass sets ``_kernel`` and is a dataclass of its
    parameters, or calls :meth:`_start` once they are set."""

    _kernel: ClassVar[Kernel[Any]]

    def __post_init__(self) -> None:
        """A dataclass subclass starts once its fields are set."""
        self._start()

    def _start(self) -> None:
        """A fresh row, for this detector's parameters."""
        self._params = self._kernel.params_vector(self)
        self._states = self._kernel.initial_state(self._params).reshape(1, self._kernel.STATE_SIZE)

    def _step(self, states: FloatArray, x: Reading, t_ms: int) -> tuple[float, float]:
        """The kernel's step on ``states`` (one row): the score and the surprise before any hold."""
        v = self._value(x)
        value = np.array([math.nan if v is None else v])
        surprise = np.zeros(1)
        t = np.array([t_ms], dtype=np.int64)
        score = self._kernel.score_learn_into(states, _ROW0, value, t, self._params, surprise)
        return float(score[0]), float(surprise[0])

    def declare(self, low: float | None = None, high: float | None = None, probation: int | None = None) -> Self:
        """Put the declared range and probation into the row, when the kernel can use them
        (its module's ``declare``); other kernels ignore them."""
        declare = getattr(self._kernel, "declare", None)
        if declare is not None:
            declare(self._states[0], low, high, probation)
        return self

    def score_one(self, x: Reading, t_ms: int) -> float:
        return self._step(self._states.copy(), x, t_ms)[0]

    def surprise_one(self, x: Reading, t_ms: int) -> float:
        return self._step(self._states.copy(), x, t_ms)[1]

    def learn_one(self, x: Reading, t_ms: int) -> None:
        self._step(self._states, x, t_ms)

    def score_learn_one(self, x: Reading, t_ms: int) -> float:
        return self._step(self._states, x, t_ms)[0]

    def to_state(self) -> dict[str, Any]:
        """The kernel's row (its module's State layout); non-finite numbers (no reading yet,
        an empty range) as their names, so the JSON is strict."""
        return {"row": [v if math.isfinite(v) else repr(v) for v in self._states[0].tolist()]}

    def set_state(self, state: Mapping[str, Any]) -> Self:
        row = np.array([float(v) for v in state["row"]])
        size = self._kernel.STATE_SIZE
        if row.shape != (size,):
            raise ValueError(f"a {self.name} state row has {size} numbers, not {row.shape}")
        self._states = row.reshape(1, size)
        return self


def warm_kernel(kernel: Kernel[Any], detector: Detector) -> None:
    """Run ``kernel`` once on one reading with ``detector``'s parameters: numba compiles
    (or loads from its cache) the batch step for the job's dtypes."""
    params = kernel.params_vector(detector)
    states = kernel.initial_state(params).reshape(1, kernel.STATE_SIZE)
    kernel.score_learn(states, np.zeros(1, dtype=np.int64), np.zeros(1), np.zeros(1, dtype=np.int64), params)
