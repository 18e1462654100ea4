"""Every catalogued detector by name, each class imported when first asked for (the fleet
detectors bring scikit-learn and river) through ordinary imports, so the layering test sees
the edge."""

from __future__ import annotations

from iotwatch.errors import UserError
from iotwatch.models.base import Detector

#: The names, in the catalogue's order.
MEMBERS = (
    "episode_likelihood",
    "declared_levels",
    "cad_ose",
    "tail_ensemble",
    "repeat_run",
    "robust_zscore",
    "hst_ranked",
    "isolation_forest",
)


def member_class(name: str) -> type[Detector]:
    """The detector class registered under ``name``."""
    found: type[Detector]
    match name:
        case "episode_likelihood":
            from iotwatch.models.episode_likelihood import EpisodeLikelihood as found
        case "declared_levels":
            from iotwatch.models.declared_levels import DeclaredLevels as found
        case "cad_ose":
            from iotwatch.models.cad_ose import CadOse as found
        case "tail_ensemble":
            from iotwatch.models.tail_ensemble import TailEnsemble as found
        case "repeat_run":
            from iotwatch.models.repeat_run import RepeatRun as found
        case "robust_zscore":
            from iotwatch.models.robust_zscore import RobustZScore as found
        case "hst_ranked":
            from iotwatch.models.halfspace_ranked import RankedHalfSpaceTrees as found
        case "isolation_forest":
            from iotwatch.models.iforest import IsolationForest as found
        case _:
            raise UserError(f"unknown detector {name!r}; choose from {', '.join(sorted(MEMBERS))}")
    return found
