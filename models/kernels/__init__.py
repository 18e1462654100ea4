"""Compiled twins of the per-reading detectors, for the streaming hot path.

The detectors in :mod:`iotwatch.models` are the readable reference: one Python object per
``(device, metric)`` stream, its state a nested JSON-able dict, microseconds a reading. A
kernel does the same arithmetic in numba-compiled code over a whole micro-batch at once,
with every stream's state one row of a float64 array: no Python object per reading, so a
reading costs arithmetic only (``python -m iotwatch.models.kernels.<name>`` times both).

:func:`kernel_for` finds the kernel of a detector by name (:data:`KERNELS`): the
streaming engine runs the one its ``device_detector`` setting names, through the small
:class:`Kernel` protocol. Each kernel names its reference detector
(``models/kernels/<name>.py`` mirrors ``models/<name>.py`` function by function, so the
two read side by side), converts state to and from the reference exactly, and
``tests/unit/models/test_kernels.py`` checks, for every kernel, that the two give the same
scores and the same final state. Change the reference first, then its
kernel, and let that test say whether they still agree.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from types import ModuleType
from typing import Protocol, cast

import numpy as np

from iotwatch.errors import UserError
from iotwatch.models.base import Detector

__all__ = ["KERNELS", "Kernel", "benchmark", "kernel_for", "warm_all", "warm_kernel"]

#: Detector name -> the module of its compiled twin.
KERNELS: dict[str, str] = {
    "cad_ose": "iotwatch.models.kernels.cad_ose",
    "episode_likelihood": "iotwatch.models.kernels.episode_likelihood",
    "tail_ensemble": "iotwatch.models.kernels.tail_ensemble",
}


class Kernel(Protocol):
    """What the streaming engine needs of a kernel module: the size of a stream's state row,
    the parameter vector read from a reference detector, a fresh row, the batch step (also
    giving each reading's surprise before the hold, :meth:`iotwatch.models.base.Detector.surprise_one`),
    and a warm-up that compiles (or loads) the step before the first micro-batch."""

    STATE_SIZE: int

    def params_vector(self, detector: Detector) -> np.ndarray: ...

    def initial_state(self, params: np.ndarray) -> np.ndarray: ...

    def score_learn(
        self, states: np.ndarray, stream: np.ndarray, values: np.ndarray, t_ms: np.ndarray, params: np.ndarray
    ) -> np.ndarray: ...

    def score_learn_into(
        self,
        states: np.ndarray,
        stream: np.ndarray,
        values: np.ndarray,
        t_ms: np.ndarray,
        params: np.ndarray,
        surprise: np.ndarray,
    ) -> np.ndarray: ...

    def warm(self) -> None: ...


def kernel_for(detector: str) -> Kernel:
    """The compiled twin of the detector registered as ``detector`` (imported on first use)."""
    try:
        module: ModuleType = importlib.import_module(KERNELS[detector])
    except KeyError:
        raise UserError(
            f"the streaming job runs detectors that have a compiled kernel "
            f"({', '.join(sorted(KERNELS))}), not {detector!r}"
        ) from None
    return cast(Kernel, module)


def warm_all() -> None:
    """Compile (or load from numba's cache) every kernel: a worker warms up before it
    knows which detector its job runs."""
    for name in KERNELS:
        kernel_for(name).warm()


def warm_kernel(kernel: Kernel, detector: Detector) -> None:
    """Run ``kernel`` once on one reading with ``detector``'s parameters: numba compiles
    (or loads from its cache) the batch step for the job's dtypes."""
    params = kernel.params_vector(detector)
    states = kernel.initial_state(params).reshape(1, kernel.STATE_SIZE)
    kernel.score_learn(states, np.zeros(1, dtype=np.int64), np.zeros(1), np.zeros(1, dtype=np.int64), params)


def benchmark(
    kernel: Kernel, make: Callable[[], Detector], streams: int = 1000, readings: int = 200_000, seed: int = 0
) -> dict[str, float]:
    """Nanoseconds a reading, reference loop (a dict a reading, as the job once called it)
    vs kernel, on interleaved noisy streams, after warm-up."""
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, streams, readings).astype(np.int64)
    values = np.round(rng.normal(20.0, 1.0, readings) + stream % 7, 2)
    t_ms = 1_700_000_000_000 + np.arange(readings, dtype=np.int64) * 100
    kernel.warm()
    params = kernel.params_vector(make())
    states = np.tile(kernel.initial_state(params), (streams, 1))
    start = time.perf_counter()
    kernel.score_learn(states, stream, values, t_ms, params)
    compiled = time.perf_counter() - start
    detectors = [make() for _ in range(streams)]
    start = time.perf_counter()
    for s, v, t in zip(stream.tolist(), values.tolist(), t_ms.tolist(), strict=True):
        detectors[s].score_learn_one({"m": v}, t)
    reference = time.perf_counter() - start
    return {"reference_ns": round(reference / readings * 1e9, 1), "kernel_ns": round(compiled / readings * 1e9, 1)}
