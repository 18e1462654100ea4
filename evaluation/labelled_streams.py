"""Run detectors over labelled streams and measure them: NAB score and alarm metrics.

For each detector every stream is scored in event-time order (no look-ahead), one
threshold is optimised over the whole corpus as NAB does, and at that threshold:

- the NAB score (raw and normalised) per stream, group and overall;
- window precision / recall / F1: an *alarm* is a row whose score reaches the threshold
  when the previous row's did not; it is true when it starts inside a window; recall is
  the share of windows with at least one detection;
- detection delay: rows and seconds from a window's start to its first detection;
- false alarms per device-day over the scored (post-probation) span.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from iotwatch.evaluation.judgement import f1
from iotwatch.evaluation.nab_scoring import (
    PROBATION_PERCENT,
    CostProfile,
    normalised,
    optimise_threshold,
    probationary_length,
    sweep_stream,
)
from iotwatch.evaluation.sources import LabelledStream
from iotwatch.models.base import Detector
from iotwatch.models.catalog import make
from iotwatch.stats import quantile, rounded

__all__ = ["PROTOCOLS", "declare_nab", "evaluate", "score_stream"]

#: What a detector is told before a stream's first reading: nothing (``live``, as the job
#: meets a metric) or what NAB's base detector gives it (``nab``, :func:`declare_nab`).
PROTOCOLS = ("live", "nab")

_DAY_MS = 86_400_000


def declare_nab(detector: Detector, values: np.ndarray) -> Detector:
    """Tell ``detector`` what NAB's base detector (``nab/detectors/base.py``) gives every
    detector before a stream's first reading: the stream's minimum and maximum
    (``inputMin``, ``inputMax``) and its probationary length, 15 % of the rows
    (``probationaryPeriod``, :func:`~iotwatch.evaluation.nab_scoring.probationary_length`)."""
    finite = values[np.isfinite(values)]
    if not len(finite):
        return detector
    return detector.declare(float(finite.min()), float(finite.max()), probationary_length(len(values)))


def score_stream(
    detector_name: str, stream: LabelledStream, params: dict[str, Any] | None = None, protocol: str = "live"
) -> np.ndarray:
    """Anomaly scores of a fresh detector over one stream, in ``[0, 1]``, under ``protocol``
    (:data:`PROTOCOLS`)."""
    detector = make(detector_name, **(params or {}))
    if protocol == "nab":
        declare_nab(detector, stream.values[:, 0])
    scores = detector.score_learn_many(stream.values, stream.t_ms, stream.metrics)
    clipped: np.ndarray = np.clip(np.nan_to_num(scores, nan=0.0), 0.0, 1.0)
    return clipped


def _stream_metrics(
    stream: LabelledStream, scores: np.ndarray, threshold: float, profile: CostProfile
) -> dict[str, Any]:
    n = len(stream)
    start = probationary_length(n, PROBATION_PERCENT)
    detected = scores >= threshold
    detected[:start] = False
    scored = [(w, left, right) for w, (left, right) in enumerate(stream.windows) if right >= start]
    in_window = np.zeros(n, dtype=bool)
    for _, left, right in scored:
        in_window[max(left, start) : right + 1] = True
    swept = sweep_stream(stream.key, scores, stream.windows, profile)
    det_scored = detected[start:]
    raw = float(swept.sweep[det_scored & (swept.window < 0)].sum())
    delays_rows, delays_s, hit = [], [], 0
    for w, left, right in scored:
        rows = np.flatnonzero(detected[max(left, start) : right + 1])
        if len(rows) == 0:
            raw -= profile.fn
            continue
        hit += 1
        first = max(left, start) + int(rows[0])
        raw += float(swept.sweep[det_scored & (swept.window == w)].max())
        delays_rows.append(first - left)
        delays_s.append((int(stream.t_ms[first]) - int(stream.t_ms[left])) / 1000.0)
    rising = detected & ~np.concatenate([[False], detected[:-1]])
    alarms = int(rising.sum())
    true_alarms = int((rising & in_window).sum())
    span_days = max(float(stream.t_ms[-1] - stream.t_ms[min(start, n - 1)]) / _DAY_MS, 1e-9) if n else 1e-9
    return {
        "key": stream.key,
        "group": stream.group,
        "rows": n,
        "windows": len(scored),
        "detected_windows": hit,
        "alarms": alarms,
        "true_alarms": true_alarms,
        "false_alarms": alarms - true_alarms,
        "days": span_days,
        "raw": raw,
        "delays_rows": delays_rows,
        "delays_s": delays_s,
    }


def _summary(parts: list[dict[str, Any]], profile: CostProfile) -> dict[str, Any]:
    windows = sum(p["windows"] for p in parts)
    hit = sum(p["detected_windows"] for p in parts)
    alarms = sum(p["alarms"] for p in parts)
    true_alarms = sum(p["true_alarms"] for p in parts)
    raw = sum(p["raw"] for p in parts)
    precision = true_alarms / alarms if alarms else None
    recall = hit / windows if windows else None
    delays_rows = [d for p in parts for d in p["delays_rows"]]
    delays_s = [d for p in parts for d in p["delays_s"]]
    days = sum(p["days"] for p in parts)
    score = normalised(raw, windows, profile)
    return {
        "nab_score": None if score is None else round(score, 3),
        "nab_raw": round(raw, 4),
        "windows": windows,
        "detected_windows": hit,
        "alarms": alarms,
        "false_alarms": alarms - true_alarms,
        "precision": rounded(precision),
        "recall": rounded(recall),
        "f1": rounded(f1(precision, recall)),
        "median_delay_rows": rounded(quantile(delays_rows, 0.5)),
        "median_delay_s": rounded(quantile(delays_s, 0.5)),
        "false_alarms_per_device_day": rounded((alarms - true_alarms) / days if days > 1e-6 else None),
    }


def evaluate(
    streams: Iterable[LabelledStream],
    detectors: list[str],
    profile: CostProfile,
    params: dict[str, dict[str, Any]] | None = None,
    protocol: str = "live",
) -> dict[str, Any]:
    """Evaluate ``detectors`` on ``streams`` under ``protocol``; the JSON-able report
    (deterministic but for ``seconds``)."""
    streams = list(streams)
    report: dict[str, Any] = {
        "streams": len(streams),
        "windows": sum(len(s.windows) for s in streams),
        "protocol": protocol,
        "detectors": {},
    }
    for name in detectors:
        began = time.perf_counter()
        scores = [score_stream(name, s, (params or {}).get(name), protocol) for s in streams]
        swept = [sweep_stream(s.key, sc, s.windows, profile) for s, sc in zip(streams, scores, strict=True)]
        threshold, _ = optimise_threshold(swept, profile)
        parts = [_stream_metrics(s, sc, threshold, profile) for s, sc in zip(streams, scores, strict=True)]
        groups = {}
        for group in sorted({p["group"] for p in parts}):
            groups[group] = _summary([p for p in parts if p["group"] == group], profile)
        report["detectors"][name] = {
            "threshold": threshold,
            "overall": _summary(parts, profile),
            "groups": groups,
            "streams": {p["key"]: _summary([p], profile) for p in parts},
            "seconds": round(time.perf_counter() - began, 2),
        }
    return report
