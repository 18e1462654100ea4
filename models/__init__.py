"""Anomaly detectors behind one small protocol (:class:`iotwatch.models.base.Detector`).

>>> from models import make, names
>>> names()[:3]
['cad_ose', 'declared_levels', 'episode_likelihood']
>>> det = make("robust_zscore")
>>> round(det.score_learn_one({"temperature_c": 21.0}, 1_700_000_000_000), 2)
0.0
"""

from iotwatch.models.base import ANOMALY_KINDS, Detector, Reading, z_to_score
from iotwatch.models.catalog import DEFAULT_DETECTOR, make, names

__all__ = ["ANOMALY_KINDS", "DEFAULT_DETECTOR", "Detector", "Reading", "make", "names", "z_to_score"]
