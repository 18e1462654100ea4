"""The Numenta Anomaly Benchmark's scoring, reproduced from its published scorer.

This follows NAB v1.1's ``nab/sweeper.py`` (``Sweeper.calcSweepScore`` and
``calcScoreByThreshold``), ``nab/optimizer.py`` and ``Runner.normalize``:

- The first ``min(floor(0.15 * n), 0.15 * 5000)`` rows of a stream are *probationary*
  and not scored at all.
- A row inside window ``[left, right]`` (row indices, width ``w = right - left + 1``) has
  the weighted score ``A_TP * S(-(right - i + 1) / w) / S(-1)``, where
  ``S(x) = 2 / (1 + exp(5x)) - 1`` (and ``-1`` for ``x >= 3``); only the *best*, i.e.
  earliest, detection of a window counts. A window without detection costs ``-A_FN``.
- A detection outside any window scores ``A_FP * S(|i - right_prev| / (w_prev - 1))``
  relative to the preceding window, or ``-A_FP`` when no window precedes it (``A_FP`` is
  given as a positive weight, as in NAB's ``profiles.json``).
- A row is a detection when its anomaly score is ``>= threshold``. The threshold is
  chosen once for the whole corpus, sweeping every distinct score from high to low
  (starting at 1.1, nothing detected) and keeping the best total; ties keep the higher
  threshold, as NAB's stable sort does.
- Normalised score ``100 * (raw - null) / (perfect - null)`` with ``null = -A_FN * W``
  (never firing) and ``perfect = A_TP * W`` for ``W`` windows in the corpus.

Window limits are mapped to rows as the first row at or after the window start and the
last row at or before its end (NAB's labels always fall on rows, where both agree).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "PROFILES",
    "CostProfile",
    "ScoredStream",
    "probationary_length",
    "scaled_sigmoid",
    "sweep_stream",
    "scores_by_threshold",
    "optimise_threshold",
    "normalised",
    "raw_at_threshold",
]


@dataclass(frozen=True)
class CostProfile:
    """NAB application profile: weights of a true positive, false negative, false positive."""

    tp: float
    fn: float
    fp: float


#: NAB's ``config/profiles.json``.
PROFILES: dict[str, CostProfile] = {
    "standard": CostProfile(tp=1.0, fn=1.0, fp=0.11),
    "reward_low_FP_rate": CostProfile(tp=1.0, fn=1.0, fp=0.22),
    "reward_low_FN_rate": CostProfile(tp=1.0, fn=2.0, fp=0.11),
}

PROBATION_PERCENT = 0.15


def probationary_length(n: int, percent: float = PROBATION_PERCENT) -> int:
    """Rows at the start of a stream that NAB does not score."""
    return int(min(math.floor(percent * n), percent * 5000))


def scaled_sigmoid(position: float) -> float:
    """NAB's reward curve: 0.987 at the left window edge, 0 at the right, -1 far after.

    >>> [round(scaled_sigmoid(p), 5) for p in (-1.0, -0.5, 0.0, 1.0, 3.0)]
    [0.98661, 0.84828, 0.0, -0.98661, -1.0]
    """
    if position >= 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * position)) - 1.0


@dataclass
class ScoredStream:
    """One stream's rows ready for threshold sweeping (probationary rows removed).

    ``window`` is the window index within the stream for rows inside a window, else -1.
    """

    key: str
    anomaly: np.ndarray
    sweep: np.ndarray
    window: np.ndarray
    n_windows: int


def sweep_stream(
    key: str,
    anomaly_scores: np.ndarray,
    windows: list[tuple[int, int]],
    profile: CostProfile,
    probation_percent: float = PROBATION_PERCENT,
) -> ScoredStream:
    """Per-row weighted scores of one stream (NAB's ``calcSweepScore``).

    ``windows`` are inclusive ``(left, right)`` row indices, sorted and disjoint.
    """
    n = len(anomaly_scores)
    sweep = np.empty(n)
    window_of = np.full(n, -1, dtype=np.int64)
    max_tp = scaled_sigmoid(-1.0)
    starts = {left: (w, left, right) for w, (left, right) in enumerate(windows)}
    current: tuple[int, int, int] | None = None
    prev_right: int | None = None
    prev_width = 0.0
    for i in range(n):
        if current is None and i in starts:
            current = starts[i]
        if current is not None:
            w, left, right = current
            width = float(right - left + 1)
            sweep[i] = scaled_sigmoid(-(right - i + 1) / width) * profile.tp / max_tp
            window_of[i] = w
            if i == right:
                prev_right, prev_width, current = right, width, None
        else:
            if prev_right is None:
                position = 3.0
            elif prev_width > 1:
                position = abs(prev_right - i) / (prev_width - 1.0)
            else:
                position = 3.0
            sweep[i] = scaled_sigmoid(position) * profile.fp
    keep = np.arange(n) >= probationary_length(n, probation_percent)
    scored_windows = {int(w) for w in window_of[keep] if w >= 0}
    return ScoredStream(
        key, np.asarray(anomaly_scores, dtype=float)[keep], sweep[keep], window_of[keep], len(scored_windows)
    )


def scores_by_threshold(streams: list[ScoredStream], profile: CostProfile) -> list[tuple[float, float]]:
    """``(threshold, raw score)`` for every distinct threshold, highest threshold first."""
    anomaly = np.concatenate([s.anomaly for s in streams]) if streams else np.empty(0)
    sweep = np.concatenate([s.sweep for s in streams]) if streams else np.empty(0)
    offsets, base = [], 0
    for s in streams:
        offsets.append(np.where(s.window >= 0, s.window + base, -1))
        base += max(int(s.window.max()) + 1 if len(s.window) else 0, 0)
    window = np.concatenate(offsets) if offsets else np.empty(0, dtype=np.int64)
    n_windows = len(set(window[window >= 0].tolist()))
    order = np.argsort(-anomaly, kind="stable")
    best = np.full(base, -profile.fn)
    total = -profile.fn * n_windows
    results: list[tuple[float, float]] = []
    threshold = 1.1
    for a, s, w in zip(anomaly[order].tolist(), sweep[order].tolist(), window[order].tolist(), strict=True):
        if a != threshold:
            results.append((threshold, total))
            threshold = a
        if w < 0:
            total += s
        elif s > best[w]:
            total += s - best[w]
            best[w] = s
    results.append((threshold, total))
    return results


def optimise_threshold(streams: list[ScoredStream], profile: CostProfile) -> tuple[float, float]:
    """The corpus-wide threshold with the best raw score (NAB's optimizer): ``(threshold, score)``."""
    return max(scores_by_threshold(streams, profile), key=lambda ts: ts[1])


def raw_at_threshold(stream: ScoredStream, threshold: float, profile: CostProfile) -> float:
    """One stream's raw NAB score at a given threshold (NAB's per-file ``score`` column):
    each detection outside a window its weight, each window its earliest detection's
    weight or ``-A_FN`` without one."""
    detected = stream.anomaly >= threshold
    outside = detected & (stream.window < 0)
    total = float(stream.sweep[outside].sum())
    for w in range(int(stream.window.max()) + 1 if len(stream.window) else 0):
        hits = stream.sweep[detected & (stream.window == w)]
        if (stream.window == w).any():
            total += float(hits.max()) if len(hits) else -profile.fn
    return total


def normalised(raw: float, n_windows: int, profile: CostProfile) -> float | None:
    """NAB's 0 (never fires) .. 100 (perfect) scale; ``None`` without windows."""
    null, perfect = -profile.fn * n_windows, profile.tp * n_windows
    if perfect == null:
        return None
    return 100.0 * (raw - null) / (perfect - null)
