"""The arithmetic of :class:`iotwatch.models.tail_ensemble.TailEnsemble`: one float64 row per stream.

The step, run over a micro-batch of interleaved streams in one call (by the class, on a
batch of one reading), is made of the members' functions in :mod:`.primitives`, which the
member classes (:class:`~iotwatch.models.robust_zscore.RobustZScore`,
:class:`~iotwatch.models.repeat_run.RepeatRun`,
:class:`~iotwatch.models.exceedance.ExceedanceTail`) call too.

State layout
------------
A row has :data:`STATE_SIZE` (28) numbers, at these offsets; counters are stored as
floats (exact below 2**53) and "none yet" as NaN:

========================  ========================================================
``ENSEMBLE_N``            readings the ensemble learned (scores start at ``warmup``)
``LEVEL_*``               the level baseline (:func:`~.primitives.zscore_learn`): ``N``,
                          ``MU``, ``VAR``, ``RVAR`` (the seasonal scale: stays 0)
``CHANGE_*``              the change forecaster (:func:`~.primitives.hw_learn`): ``N``,
                          ``LEVEL``, ``TREND``, ``RVAR``, ``BEYOND``
``STUCK_*``               the run detector (:func:`~.primitives.repeat_learn`): ``N``,
                          ``RATE``, ``LAST`` (NaN: none yet), ``RUN``, ``REVERSALS``,
                          ``DIRECTION``
``LEVEL_TAIL + TAIL_*``   the level view's Pareto tail (:func:`~.primitives.tail_learn`):
                          ``N``, ``RATE``, ``PEAKS``, ``INDEX``, ``GAP``,
                          ``CLUSTER_PEAK`` (the order of ``tail_learn``'s state)
``CHANGE_TAIL + TAIL_*``  the change view's, likewise
========================  ========================================================

Each member's numbers are contiguous, in this order. No seasonal arrays: the ensemble's
level and change views have no season. Parameters are a float64 vector too
(:func:`params_vector`, offsets ``P_*`` and, per tail, ``TP_*``).

A deviation of a view warming up is NaN: its tail is 1.0 and nothing is learned from it.
The step computes the same floats compiled and as plain Python (``NUMBA_DISABLE_JIT=1``; see
:mod:`.primitives`), and ``iotwatch bench stream`` times it.

Examples
--------
Two streams interleaved in one call; stream 1 ends with a spike. The batch gives stream 1
the scores a detector fed stream 1 alone gives it:

>>> import numpy as np
>>> from iotwatch.models.tail_ensemble import TailEnsemble
>>> params = params_vector(TailEnsemble())
>>> states = np.tile(initial_state(params), (2, 1))
>>> rng = np.random.default_rng(1)
>>> stream = np.arange(4000, dtype=np.int64) % 2
>>> values = np.round(20.0 + rng.normal(0.0, 0.1, 4000), 2)
>>> values[-1] = 25.0
>>> t_ms = 1_700_000_000_000 + np.arange(4000, dtype=np.int64) // 2 * 60_000
>>> scores = score_learn(states, stream, values, t_ms, params)
>>> round(float(scores[:-1].max()), 2), round(float(scores[-1]), 2), int(states[1, ENSEMBLE_N])
(0.35, 0.72, 2000)
>>> one = TailEnsemble()
>>> alone = [one.score_learn_one({"m": v}, t) for v, t in zip(values[1::2].tolist(), t_ms[1::2].tolist())]
>>> bool(np.array_equal(scores[1::2], alone))
True
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from iotwatch.models.exceedance import ExceedanceTail
from iotwatch.models.kernels.primitives import (
    TAIL_PARAMS,
    TAIL_SIZE,
    Floats,
    check_batch,
    hw_deviation,
    hw_learn,
    jit,
    log_tail_score,
    put_initial_tail,
    put_state,
    put_tail_params,
    py_min,
    reading_value,
    repeat_learn,
    repeat_tail,
    tail_learn,
    tail_params,
    tail_state,
    tail_tail,
    zscore_deviation,
    zscore_learn,
)
from iotwatch.models.numeric import decay_weight
from iotwatch.models.repeat_run import RepeatRun
from iotwatch.models.robust_zscore import RobustZScore

if TYPE_CHECKING:
    from iotwatch.models.tail_ensemble import TailEnsemble
__all__ = [
    "CHANGE_BEYOND",
    "CHANGE_LEVEL",
    "CHANGE_N",
    "CHANGE_RVAR",
    "CHANGE_TAIL",
    "CHANGE_TREND",
    "ENSEMBLE_N",
    "LEVEL_MU",
    "LEVEL_N",
    "LEVEL_RVAR",
    "LEVEL_TAIL",
    "LEVEL_VAR",
    "PARAMS_SIZE",
    "STATE_SIZE",
    "STUCK_DIRECTION",
    "STUCK_LAST",
    "STUCK_N",
    "STUCK_RATE",
    "STUCK_REVERSALS",
    "STUCK_RUN",
    "initial_state",
    "params_vector",
    "score_learn",
    "score_learn_into",
]

# --- state layout: offsets into one stream's row ---------------------------------------------

ENSEMBLE_N = 0
LEVEL_N, LEVEL_MU, LEVEL_VAR, LEVEL_RVAR = 1, 2, 3, 4
CHANGE_N, CHANGE_LEVEL, CHANGE_TREND, CHANGE_RVAR, CHANGE_BEYOND = 5, 6, 7, 8, 9
STUCK_N, STUCK_RATE, STUCK_LAST, STUCK_RUN, STUCK_REVERSALS, STUCK_DIRECTION = 10, 11, 12, 13, 14, 15
LEVEL_TAIL = 16
CHANGE_TAIL = LEVEL_TAIL + TAIL_SIZE
STATE_SIZE = CHANGE_TAIL + TAIL_SIZE

# --- parameter layout --------------------------------------------------------------------------

P_WARMUP = 0
P_LEVEL_WARMUP, P_LEVEL_A, P_LEVEL_CLIP = 1, 2, 3
P_CHANGE_WARMUP, P_CHANGE_ALPHA, P_CHANGE_BETA, P_CHANGE_A_VAR, P_CHANGE_CLIP, P_CHANGE_RESET_AFTER = 4, 5, 6, 7, 8, 9
(P_STUCK_TOLERANCE, P_STUCK_A, P_STUCK_PRIOR_RATE, P_STUCK_PRIOR_READINGS, P_STUCK_MAX_RATE, P_STUCK_MIN_REVERSALS) = (
    range(10, 16)
)
P_LEVEL_TAIL = 16
P_CHANGE_TAIL = P_LEVEL_TAIL + TAIL_PARAMS
PARAMS_SIZE = P_CHANGE_TAIL + TAIL_PARAMS

_jit = jit
#: The empty ``surprise`` of :func:`score_learn` (no surprises kept).
_NO_SURPRISE = np.empty(0)


# --- parameters and a fresh row ----------------------------------------------------------------


def params_vector(detector: TailEnsemble) -> np.ndarray:
    """Every number the step needs, read from the members the ensemble is made of, built
    from its parameters (so the smoothing constants are the members' own floats)."""
    members = min(detector.warmup, 30)
    level = RobustZScore(halflife=detector.level_halflife, season_buckets=0, warmup=members)
    stuck = RepeatRun(max_repeat_rate=detector.max_repeat_rate)
    p = np.empty(PARAMS_SIZE)
    p[P_WARMUP] = detector.warmup
    p[P_LEVEL_WARMUP], p[P_LEVEL_A], p[P_LEVEL_CLIP] = level.warmup, level._a, level.clip
    # the change view: Holt's one-step forecast, its residual scale's half-life 300 readings
    p[P_CHANGE_WARMUP], p[P_CHANGE_ALPHA], p[P_CHANGE_BETA] = members, detector.change_alpha, 0.01
    p[P_CHANGE_A_VAR], p[P_CHANGE_CLIP], p[P_CHANGE_RESET_AFTER] = decay_weight(300.0), 3.0, 3
    p[P_STUCK_TOLERANCE], p[P_STUCK_A], p[P_STUCK_PRIOR_RATE] = stuck.tolerance, stuck._a, stuck.prior_rate
    p[P_STUCK_PRIOR_READINGS], p[P_STUCK_MAX_RATE] = stuck.prior_readings, stuck.max_repeat_rate
    p[P_STUCK_MIN_REVERSALS] = stuck.min_reversals
    for base in (P_LEVEL_TAIL, P_CHANGE_TAIL):
        put_tail_params(p, base, ExceedanceTail(threshold=detector.z_threshold, prior_index=detector.tail_index_prior))
    return p


def initial_state(params: np.ndarray) -> np.ndarray:
    """A fresh stream's row: nothing learned, the members' priors."""
    row = np.zeros(STATE_SIZE)
    row[STUCK_RATE] = params[P_STUCK_PRIOR_RATE]
    row[STUCK_LAST] = math.nan
    for base, p_base in ((LEVEL_TAIL, P_LEVEL_TAIL), (CHANGE_TAIL, P_CHANGE_TAIL)):
        put_initial_tail(row, base, params, p_base)
    return row


# --- the step ------------------------------------------------------------------------------------


@_jit
def _member_params(p: np.ndarray) -> tuple[float, Floats, Floats, Floats, Floats, Floats]:
    """The parameter vector as the members' tuples, once a batch."""
    level = (p[P_LEVEL_WARMUP], p[P_LEVEL_A], p[P_LEVEL_CLIP])
    change = (
        p[P_CHANGE_WARMUP],
        p[P_CHANGE_ALPHA],
        p[P_CHANGE_BETA],
        p[P_CHANGE_A_VAR],
        p[P_CHANGE_CLIP],
        p[P_CHANGE_RESET_AFTER],
    )
    stuck = (
        p[P_STUCK_TOLERANCE],
        p[P_STUCK_A],
        p[P_STUCK_PRIOR_READINGS],
        p[P_STUCK_MAX_RATE],
        p[P_STUCK_MIN_REVERSALS],
    )
    return p[P_WARMUP], level, change, stuck, tail_params(p, P_LEVEL_TAIL), tail_params(p, P_CHANGE_TAIL)


@_jit
def _score_learn_one(row: np.ndarray, x: float, members: tuple[float, Floats, Floats, Floats, Floats, Floats]) -> float:
    """Score, then learn, one reading of one stream's row: the smallest of the three views'
    tails, times three, on the log scale."""
    warmup, level_p, change_p, stuck_p, level_tail_p, change_tail_p = members
    v = reading_value(x)
    if math.isnan(v):
        return 0.0
    level_state = (row[LEVEL_N], row[LEVEL_MU], row[LEVEL_VAR])
    change_state = (row[CHANGE_N], row[CHANGE_LEVEL], row[CHANGE_TREND], row[CHANGE_RVAR], row[CHANGE_BEYOND])
    stuck_state = (
        row[STUCK_N],
        row[STUCK_RATE],
        row[STUCK_LAST],
        row[STUCK_RUN],
        row[STUCK_REVERSALS],
        row[STUCK_DIRECTION],
    )
    level_tail, change_tail = tail_state(row, LEVEL_TAIL), tail_state(row, CHANGE_TAIL)
    level = abs(zscore_deviation(level_state, level_p, v))  # NaN: warming up
    change = abs(hw_deviation(change_state, change_p, v))
    score = 0.0
    if row[ENSEMBLE_N] >= warmup:
        tail = py_min(
            py_min(tail_tail(level_tail, level_tail_p, level), tail_tail(change_tail, change_tail_p, change)),
            repeat_tail(stuck_state, stuck_p, v),
        )
        score = log_tail_score(py_min(1.0, 3.0 * tail))
    put_state(row, LEVEL_TAIL, tail_learn(level_tail, level_tail_p, level))
    put_state(row, CHANGE_TAIL, tail_learn(change_tail, change_tail_p, change))
    put_state(row, LEVEL_N, zscore_learn(level_state, level_p, v))
    put_state(row, CHANGE_N, hw_learn(change_state, change_p, v))
    put_state(row, STUCK_N, repeat_learn(stuck_state, stuck_p, v))
    row[ENSEMBLE_N] += 1.0
    return score


@_jit
def score_learn_into(
    states: np.ndarray,
    stream: np.ndarray,
    values: np.ndarray,
    t_ms: np.ndarray,
    params: np.ndarray,
    surprise: np.ndarray,
) -> np.ndarray:
    """Score, then learn, each reading in order against its stream's row of ``states``
    (updated in place; the :class:`~iotwatch.models.kernels.Kernel` call, ``t_ms`` unused),
    as :class:`~iotwatch.models.tail_ensemble.TailEnsemble` scores them; the ensemble holds
    nothing, so each reading's surprise is its score, copied to ``surprise`` when it has the
    batch's length. A non-finite value scores 0 and is not learned. Raises on mismatched
    shapes or a stream index out of range, before learning anything."""
    n = check_batch(states, stream, values, t_ms, params, STATE_SIZE, PARAMS_SIZE)
    members = _member_params(params)
    keep = surprise.shape[0] == n
    out = np.empty(n)
    for i in range(n):
        out[i] = _score_learn_one(states[stream[i]], values[i], members)
        if keep:
            surprise[i] = out[i]
    return out


def score_learn(
    states: np.ndarray, stream: np.ndarray, values: np.ndarray, t_ms: np.ndarray, params: np.ndarray
) -> np.ndarray:
    """:func:`score_learn_into` without the surprises: the scores alone."""
    return score_learn_into(states, stream, values, t_ms, params, _NO_SURPRISE)
