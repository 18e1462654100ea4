"""The job's default detector beside a reproduced NAB leader and NAB's published figures,
per half of the nab-dev split (:data:`iotwatch.evaluation.sources.NAB_SPLIT`) and whole
(docs/detection.md, "A reproduced NAB leader"): the default with the job's parameters under
the live and NAB protocols; CAD OSE (:func:`iotwatch.models.cad_ose.nab_scores`) run as NAB
runs it, at its threshold optimised on the streams reported and at the published corpus
threshold (where it equals the published figure when the reproduction is exact); NAB's
published per-stream standard scores of six detectors
(:data:`~iotwatch.evaluation.sources.NAB_PUBLISHED_SCORES`), normalised between the detector
that never fires and a perfect one."""

from __future__ import annotations

import csv
from collections import defaultdict
from typing import Any

import numpy as np

from iotwatch.evaluation.labelled_streams import score_stream
from iotwatch.evaluation.nab_scoring import (
    CostProfile,
    normalised,
    optimise_threshold,
    raw_at_threshold,
    sweep_stream,
)
from iotwatch.evaluation.sources import NAB_PUBLISHED_SCORES, LabelledStream, split_keys
from iotwatch.models.cad_ose import nab_scores
from iotwatch.models.catalog import DEFAULT_DETECTOR

__all__ = ["DEFAULT_FIGURES", "PUBLISHED_DETECTORS", "REPRODUCED", "compare", "published_scores"]

#: NAB's name of the detector :mod:`iotwatch.models.cad_ose` reproduces.
REPRODUCED = "contextOSE"
#: Published detectors in the order of their whole-corpus score.
PUBLISHED_DETECTORS = ("ARTime", "numenta", "contextOSE", "knncad", "randomCutForest", "windowedGaussian")
#: The default detector's figure under each protocol (:data:`~iotwatch.evaluation.labelled_streams.PROTOCOLS`),
#: by its key in a part of the report.
DEFAULT_FIGURES = {"live": "default", "nab": "default_nab_protocol"}


def published_scores() -> dict[str, dict[str, dict[str, float]]]:
    """Detector -> stream key -> ``{"threshold", "score"}`` (standard profile), ``null`` included."""
    table: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    with NAB_PUBLISHED_SCORES.open() as handle:
        for row in csv.DictReader(handle):
            table[row["detector"]][row["file"]] = {"threshold": float(row["threshold"]), "score": float(row["score"])}
    return dict(table)


def _published_figure(table: dict[str, dict[str, dict[str, float]]], detector: str, keys: list[str]) -> float:
    null = sum(table["null"][k]["score"] for k in keys)
    raw = sum(table[detector][k]["score"] for k in keys)
    return 100.0 * (raw - null) / (-null - null)


def _figure(
    streams: list[LabelledStream], scores: dict[str, np.ndarray], profile: CostProfile, threshold: float | None = None
) -> dict[str, float | None]:
    swept = [sweep_stream(s.key, scores[s.key], s.windows, profile) for s in streams]
    windows = sum(s.n_windows for s in swept)
    if threshold is None:
        threshold, raw = optimise_threshold(swept, profile)
    else:
        raw = sum(raw_at_threshold(s, threshold, profile) for s in swept)
    score = normalised(raw, windows, profile)
    return {"nab_score": None if score is None else round(score, 1), "threshold": round(threshold, 6)}


def compare(streams: list[LabelledStream], profile: CostProfile) -> dict[str, Any] | None:
    """The side-by-side report for the nab-dev streams among ``streams`` (None: none, or a
    profile other than the standard one, the only one NAB's results hold here)."""
    table = published_scores()
    known = [s for s in streams if s.key in table["null"]]
    if not known or profile != CostProfile(tp=1.0, fn=1.0, fp=0.11):
        return None
    default = {p: {s.key: score_stream(DEFAULT_DETECTOR, s, protocol=p) for s in known} for p in DEFAULT_FIGURES}
    reproduced = {s.key: nab_scores(s.values[:, 0]) for s in known}
    published_threshold = next(iter(table[REPRODUCED].values()))["threshold"]
    parts = {"tuning": split_keys("tuning"), "held_out": split_keys("held_out")}
    if all(any(s.key in keys for s in known) for keys in parts.values()):
        parts["whole"] = {s.key for s in known}
    report: dict[str, Any] = {"default": DEFAULT_DETECTOR, "reproduced": f"cad_ose ({REPRODUCED})", "parts": {}}
    for part, keys in parts.items():
        chosen = [s for s in known if s.key in keys]
        if not chosen:
            continue
        names = [s.key for s in chosen]
        report["parts"][part] = {
            "streams": len(chosen),
            **{key: _figure(chosen, default[protocol], profile) for protocol, key in DEFAULT_FIGURES.items()},
            "reproduced": _figure(chosen, reproduced, profile),
            "reproduced_at_published_threshold": _figure(chosen, reproduced, profile, published_threshold),
            "published": {d: round(_published_figure(table, d, names), 1) for d in PUBLISHED_DETECTORS},
        }
    return report
