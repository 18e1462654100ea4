"""Compiled twins of the per-reading detectors, for the streaming hot path.

The detectors in :mod:`models` are the readable reference: one Python object per
``(device, metric)`` stream, its state a nested JSON-able dict, about 18 us a reading. A
kernel does the same arithmetic in numba-compiled code over a whole micro-batch at once,
with every stream's state one row of a float64 array: no Python object per reading, so a
reading costs a few hundred nanoseconds or less.

Each kernel names its reference detector (``models/kernels/<name>.py`` mirrors
``models/<name>.py`` function by function, so the two read side by side), converts state
to and from the reference exactly, and ``tests/models/test_kernels.py`` checks that the
two give the same scores and the same final state. Change the reference first, then its
kernel, and let that test say whether they still agree.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Protocol, cast

import numpy as np

from models.base import Detector

__all__ = ["KERNELS", "Kernel", "kernel_for", "warm_all"]

#: Detector name -> the module of its compiled twin.
KERNELS: dict[str, str] = {
    "tail_ensemble": "models.kernels.tail_ensemble",
}


class Kernel(Protocol):
    """What the streaming engine needs of a kernel module: the size of a stream's state row,
    the parameter vector read from a reference detector, a fresh row, the batch step, and a
    warm-up that compiles (or loads) the step before the first micro-batch."""

    STATE_SIZE: int

    def params_vector(self, detector: Detector) -> np.ndarray: ...

    def initial_state(self, params: np.ndarray) -> np.ndarray: ...

    def score_learn(self, states: np.ndarray, stream: np.ndarray, values: np.ndarray, t_ms: np.ndarray,
                    params: np.ndarray) -> np.ndarray: ...

    def warm(self) -> None: ...


def kernel_for(detector: str) -> Kernel:
    """The compiled twin of the detector registered as ``detector`` (imported on first use)."""
    try:
        module: ModuleType = importlib.import_module(KERNELS[detector])
    except KeyError:
        raise ValueError(f"the streaming job runs detectors that have a compiled kernel "
                         f"({', '.join(sorted(KERNELS))}), not {detector!r}") from None
    return cast(Kernel, module)


def warm_all() -> None:
    """Compile (or load from numba's cache) every kernel: a worker warms up before it
    knows which detector its job runs."""
    for name in KERNELS:
        kernel_for(name).warm()
