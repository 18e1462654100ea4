"""Every detector by name: the CLI, the evaluation and the contract tests iterate this.

>>> from iotwatch.models.catalog import make, names
>>> "tail_ensemble" in names()
True
>>> make("robust_zscore", halflife=100.0).halflife
100.0
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Iterable
from typing import Any

from iotwatch.errors import UserError
from iotwatch.models.base import PAYLOAD_FORMAT, Detector
from iotwatch.models.kernels import Kernel, KernelDetector, warm_kernel
from iotwatch.models.members import MEMBERS, member_class

__all__ = [
    "DEFAULT_DETECTOR",
    "DETECTORS",
    "KERNELS",
    "check_kernels",
    "detector_class",
    "kernel_for",
    "load",
    "make",
    "names",
    "warm",
    "warm_all",
]

#: Every detector's name.
DETECTORS: tuple[str, ...] = MEMBERS

#: The detectors with a compiled kernel (:mod:`iotwatch.models.kernels`), which the streaming job runs.
KERNELS: tuple[str, ...] = ("cad_ose", "declared_levels", "episode_likelihood", "tail_ensemble")

#: The detector ``score-csv`` uses unless told otherwise, and the streaming job's
#: (``StreamSettings.device_detector``, run with its own defaults; a test holds detector and
#: parameters equal): compact state, a compiled kernel, one alarm per episode. On a metric
#: with no declared range it scores as ``episode_likelihood``, the best catalogued detector
#: on NAB as a stream meets its readings; given NAB's declared range and probation it adds
#: the range's levels and passes HTM's published figure (docs/detection.md has the figures).
DEFAULT_DETECTOR = "declared_levels"


def names() -> list[str]:
    """Registered detector names, sorted."""
    return sorted(DETECTORS)


def detector_class(name: str) -> type[Detector]:
    """The detector class registered under ``name`` (its module imported on first use)."""
    if name not in MEMBERS:
        raise UserError(f"unknown detector {name!r}; choose from {', '.join(names())}")
    return member_class(name)


def make(name: str, **params: Any) -> Detector:
    """A fresh detector registered under ``name``, with ``params`` overriding its defaults."""
    return detector_class(name)(**params)


def check_kernels(detectors: Iterable[str]) -> None:
    """Refuse detectors without a compiled kernel (without importing any kernel: a driver
    checks its settings this way before its tasks compile them)."""
    missing = sorted(set(detectors) - set(KERNELS))
    if missing:
        raise UserError(
            f"the streaming job runs detectors that have a compiled kernel "
            f"({', '.join(sorted(KERNELS))}), not {', '.join(map(repr, missing))}"
        )


def kernel_for(detector: str) -> Kernel[Any]:
    """The kernel of the detector registered as ``detector`` (imported on first use)."""
    check_kernels([detector])
    cls = detector_class(detector)
    assert issubclass(cls, KernelDetector), cls
    return cls._kernel


def warm(detector: str) -> None:
    """Compile (or load from numba's cache) the kernel of ``detector`` for the job's dtypes."""
    warm_kernel(kernel_for(detector), make(detector))


def warm_all() -> None:
    """Compile (or load from numba's cache) every kernel: a worker warms up before it
    knows which detector its job runs."""
    for name in KERNELS:
        warm(name)


#: Packages that fleet-model pickles written before the stages installed under ``iotwatch``
#: name at the top level (``models.iforest``); read as ``iotwatch.<stage>``, so a registry
#: written then still loads.
_UNPREFIXED_STAGES = frozenset({"models", "devices", "streaming", "evaluation"})


class _RegistryUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.split(".", 1)[0] in _UNPREFIXED_STAGES:
            module = f"iotwatch.{module}"
        return super().find_class(module, name)


def load(payload: bytes) -> Detector:
    """The detector :meth:`Detector.dumps` wrote (JSON of a compact state, resolved by name
    here; a pickle for fleet models: only load those from a registry you trust)."""
    if payload[:1] == b"{":
        doc = json.loads(payload)
        if doc.get("format") != PAYLOAD_FORMAT:
            raise UserError(f"unsupported detector payload format {doc.get('format')!r}")
        return detector_class(doc["detector"])(**doc["params"]).set_state(doc["state"])
    obj = _RegistryUnpickler(io.BytesIO(payload)).load()
    if not isinstance(obj, Detector):
        raise UserError(f"payload holds a {type(obj).__name__}, not a Detector")
    return obj
