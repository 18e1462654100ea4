"""Every detector by name: the CLI, the evaluation and the contract tests iterate this.

>>> from iotwatch.models.catalog import make, names
>>> "ensemble" in names()
True
>>> make("robust_zscore", halflife=100.0).halflife
100.0
"""

from __future__ import annotations

import importlib
import io
import json
import pickle
from typing import Any

from iotwatch.errors import UserError
from iotwatch.models.base import PAYLOAD_FORMAT, Detector

__all__ = ["DEFAULT_DETECTOR", "DETECTORS", "describe", "detector_class", "load", "make", "names"]

#: Name -> module that defines it (imported on first use).
DETECTORS: dict[str, str] = {
    "ensemble": "iotwatch.models.ensemble:CalibratedEnsemble",
    "episode_likelihood": "iotwatch.models.episode_likelihood:EpisodeLikelihood",
    "declared_levels": "iotwatch.models.declared_levels:DeclaredLevels",
    "cad_ose": "iotwatch.models.cad_ose:CadOse",
    "tail_ensemble": "iotwatch.models.tail_ensemble:TailEnsemble",
    "repeat_run": "iotwatch.models.repeat_run:RepeatRun",
    "robust_zscore": "iotwatch.models.robust_zscore:RobustZScore",
    "holt_winters": "iotwatch.models.forecast:HoltWintersResidual",
    "half_space_trees": "iotwatch.models.halfspace:HalfSpaceTrees",
    "hst_ranked": "iotwatch.models.halfspace_ranked:RankedHalfSpaceTrees",
    "isolation_forest": "iotwatch.models.iforest:IsolationForest",
    "flatline": "iotwatch.models.flatline:Flatline",
    "crash": "iotwatch.models.crash:CrashDeceleration",
}

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
    try:
        module_name, attribute = DETECTORS[name].split(":")
    except KeyError:
        raise UserError(f"unknown detector {name!r}; choose from {', '.join(names())}") from None
    return getattr(importlib.import_module(module_name), attribute)


def make(name: str, **params: Any) -> Detector:
    """A fresh detector registered under ``name``, with ``params`` overriding its defaults."""
    return detector_class(name)(**params)


def describe(name: str) -> dict[str, Any]:
    """Name, kind of state, claimed anomaly kinds and the first docstring line of a detector."""
    cls = detector_class(name)
    return {
        "name": name,
        "state": "compact" if cls.compact_state else "fleet",
        "detects": sorted(cls.detects),
        "summary": (cls.__doc__ or "").strip().splitlines()[0],
    }


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
        return detector_class(doc["detector"]).from_state(doc["state"], **doc["params"])
    obj = _RegistryUnpickler(io.BytesIO(payload)).load()
    if not isinstance(obj, Detector):
        raise UserError(f"payload holds a {type(obj).__name__}, not a Detector")
    return obj
