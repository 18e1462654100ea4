"""The arithmetic of :class:`iotwatch.models.declared_levels.DeclaredLevels`: one float64 row per stream.

A row is an :mod:`episode_likelihood <iotwatch.models.kernels.episode_likelihood>` row
followed by the *level* view that a declared value range makes possible:

=====================  ==========================================================
``EL + k``             the episode-likelihood row (:data:`EL_SIZE` numbers)
``LOW``, ``HIGH``      the declared range (NaN: none declared, the row scores as
                       ``episode_likelihood`` alone)
``PROBATION``          readings learned before the level view scores (NaN: ``warmup``)
``HELD``               the level score's held peak (one alarm per episode)
``COUNTS + o + b``     readings seen in level ``b`` of resolution ``r`` (the
                       resolutions :data:`RESOLUTIONS` laid end to end from ``o``)
=====================  ==========================================================

The level view cuts the declared range into 24, 32 and 40 equal levels and judges a
reading by how rarely its level has been visited so far: ``-log10`` of the level's share
(a prior of one reading spread over the levels keeps it finite), the least surprising of
the three resolutions (so a reading near a level's edge is not judged by a cut that
happens to split its neighbourhood). Decades ``d`` score ``d / (d + 10)``, as the
episode-likelihood views do; a reading scores only above the held, decaying peak of
earlier level scores. The row's score is the larger, in decades, of the level view's and
the episode-likelihood score less ``shift`` decades (with the range known, a reading at a
level the stream has not visited is the stronger evidence), times ``stretch``: so the
alert's fire score (0.40) is where NAB's threshold falls on these scores too.

Cost: the episode-likelihood step plus 96 counts read and three written a reading; the
row is 152 numbers (1,216 B). A row without a declared range runs the episode-likelihood
step alone; the streaming job keeps such metrics in :data:`UNDECLARED`'s rows (416 B).
``iotwatch bench stream`` times both.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from iotwatch.models.kernels import episode_likelihood as el
from iotwatch.models.kernels.primitives import check_batch, decay_weight, jit, py_max, reading_value, tail_params

if TYPE_CHECKING:
    from iotwatch.models.declared_levels import DeclaredLevels

__all__ = [
    "PARAMS_SIZE",
    "RESOLUTIONS",
    "STATE_SIZE",
    "UNDECLARED",
    "declare",
    "initial_state",
    "params_vector",
    "score_learn",
    "score_learn_into",
]

#: Levels the declared range is cut into, at each resolution.
RESOLUTIONS = (24, 32, 40)
#: Decades of the level view's tail that score 0.5, as in episode_likelihood.
_HALF_DECADES = 10.0

EL_SIZE = el.STATE_SIZE
#: The kernel of a metric with no declared range: its rows score as episode_likelihood's
#: alone, so the job keeps them in that kernel's narrower rows (``streaming/detector_plan.py``).
UNDECLARED = el
LOW, HIGH, PROBATION, HELD = EL_SIZE, EL_SIZE + 1, EL_SIZE + 2, EL_SIZE + 3
COUNTS = EL_SIZE + 4
STATE_SIZE = COUNTS + sum(RESOLUTIONS)

P_EL = 0
P_SHIFT, P_HOLD, P_STRETCH, P_MIN_VARIANCE = range(el.PARAMS_SIZE, el.PARAMS_SIZE + 4)
PARAMS_SIZE = el.PARAMS_SIZE + 4


def params_vector(detector: DeclaredLevels) -> np.ndarray:
    """The episode-likelihood parameters, then the shift, the level hold's decay, the stretch
    and the likelihood views' variance floor on a row with a declared range."""
    p = np.empty(PARAMS_SIZE)
    p[: el.PARAMS_SIZE] = el.params_vector(detector)
    p[P_SHIFT] = detector.shift_decades
    p[P_HOLD] = 1.0 - decay_weight(detector.level_hold_halflife)
    p[P_STRETCH] = detector.stretch
    p[P_MIN_VARIANCE] = detector.declared_min_variance
    return p


def initial_state(params: np.ndarray) -> np.ndarray:
    """A fresh row: nothing learned, no range declared."""
    row = np.zeros(STATE_SIZE)
    row[:EL_SIZE] = el.initial_state(params[: el.PARAMS_SIZE])
    row[LOW] = row[HIGH] = row[PROBATION] = math.nan
    return row


def declare(row: np.ndarray, low: float | None, high: float | None, probation: int | None) -> None:
    """Put a declared range (both ends, ``low < high``) and probation into a fresh row."""
    if low is not None and high is not None and math.isfinite(low) and math.isfinite(high) and high > low:
        row[LOW], row[HIGH] = low, high
    if probation is not None:
        row[PROBATION] = float(probation)


@jit
def _decades(d: float) -> float:
    """Decades of a score ``d / (d + 10)`` (its inverse)."""
    s = min(d, 0.999999)
    return _HALF_DECADES * s / (1.0 - s)


@jit
def _levels(row: np.ndarray, v: float) -> float:
    """Learn ``v``'s level at each resolution; the least surprise (decades) before it."""
    low, high = row[LOW], row[HIGH]
    x = min(max((v - low) / (high - low), 0.0), 1.0)
    n = row[el.N]
    least = math.inf
    offset = COUNTS
    for bins in RESOLUTIONS:
        b = offset + min(int(x * bins), bins - 1)
        share = (row[b] + 1.0 / bins) / (n + 1.0)
        least = min(least, -math.log10(share))
        row[b] += 1.0
        offset += bins
    return least


@jit
def _score_learn_one(
    row: np.ndarray, x: float, t: float, p: np.ndarray, tail_p: tuple[float, ...], stuck_p: tuple[float, ...]
) -> tuple[float, float]:
    """Score, then learn, one reading: episode_likelihood's score, lifted by the level view
    when the row has a declared range."""
    v = reading_value(x)
    if math.isnan(row[LOW]) or math.isnan(v):
        return el._score_learn_one(row, x, t, p, tail_p, stuck_p)
    n = row[el.N]
    surprise = _levels(row, v)
    out, raw = el._score_learn_one(row, x, t, p, tail_p, stuck_p)
    probation = row[PROBATION] if not math.isnan(row[PROBATION]) else p[el.P_WARMUP]
    if n < probation:
        return 0.0, 0.0
    score = surprise / (surprise + _HALF_DECADES)
    level_out = score if score > row[HELD] else 0.0
    row[HELD] = py_max(row[HELD] * p[P_HOLD], score)
    shifted = py_max(_decades(out) - p[P_SHIFT], 0.0)
    decades = p[P_STRETCH] * py_max(_decades(level_out), shifted)
    raw_decades = p[P_STRETCH] * py_max(surprise, py_max(_decades(raw) - p[P_SHIFT], 0.0))
    return decades / (decades + _HALF_DECADES), raw_decades / (raw_decades + _HALF_DECADES)


@jit
def score_learn_into(
    states: np.ndarray,
    stream: np.ndarray,
    values: np.ndarray,
    t_ms: np.ndarray,
    params: np.ndarray,
    surprise: np.ndarray,
) -> np.ndarray:
    """Score, then learn, each reading in order against its stream's row of ``states``, as
    :func:`iotwatch.models.kernels.episode_likelihood.score_learn_into` does (same
    arguments); rows with a declared range add the level view, their likelihood views
    floored at ``declared_min_variance``."""
    n = check_batch(states, stream, values, t_ms, params, STATE_SIZE, PARAMS_SIZE)
    tail_p = tail_params(params, el.P_STEP_TAIL)
    q = el.P_STUCK
    stuck_p = (params[q], params[q + 1], params[q + 2], params[q + 3], params[q + 4])
    declared = params.copy()
    declared[el.P_MIN_VARIANCE] = params[P_MIN_VARIANCE]
    keep = surprise.shape[0] == n
    out = np.empty(n)
    for i in range(n):
        row = states[stream[i]]
        if math.isnan(row[LOW]):  # no declared range: episode_likelihood's step alone
            out[i], raw = el._score_learn_one(row, values[i], float(t_ms[i]), params, tail_p, stuck_p)
        else:
            out[i], raw = _score_learn_one(row, values[i], float(t_ms[i]), declared, tail_p, stuck_p)
        if keep:
            surprise[i] = raw
    return out


_NO_SURPRISE = np.empty(0)


def score_learn(
    states: np.ndarray, stream: np.ndarray, values: np.ndarray, t_ms: np.ndarray, params: np.ndarray
) -> np.ndarray:
    """:func:`score_learn_into` without the surprises: the scores alone."""
    return score_learn_into(states, stream, values, t_ms, params, _NO_SURPRISE)
