"""Compiled twin of :class:`iotwatch.models.tail_ensemble.TailEnsemble`: one float64 row per stream.

The streaming job scores every reading of every ``(device, metric)`` stream with the tail
ensemble. The reference detector is a tree of six Python objects, microseconds a reading;
this kernel runs the same arithmetic, operation for operation, over a whole micro-batch
of interleaved streams in one numba call, each stream's state a row of one float64 array.

State layout
------------
A row has :data:`STATE_SIZE` (28) numbers, at these offsets; counters are stored as
floats (exact below 2**53) and ``None`` as NaN:

========================  ========================================================
``ENSEMBLE_N``            readings the ensemble learned (scores start at ``warmup``)
``LEVEL_*``               :class:`~iotwatch.models.robust_zscore.RobustZScore`: ``N``, ``MU``,
                          ``VAR``, ``RVAR`` (the seasonal scale: stays 0 without season)
``CHANGE_*``              :class:`~iotwatch.models.forecast.HoltWintersResidual`: ``N``,
                          ``LEVEL``, ``TREND``, ``RVAR``, ``BEYOND``
``STUCK_*``               :class:`~iotwatch.models.repeat_run.RepeatRun`: ``N``, ``RATE``,
                          ``LAST`` (NaN: none yet), ``RUN``, ``REVERSALS``, ``DIRECTION``
``LEVEL_TAIL + TAIL_*``   the level view's :class:`~iotwatch.models.exceedance.ExceedanceTail`:
                          ``N``, ``RATE``, ``PEAKS``, ``INDEX``, ``GAP``,
                          ``CLUSTER_PEAK`` (the order of its ``to_state`` list)
``CHANGE_TAIL + TAIL_*``  the change view's, likewise
========================  ========================================================

Each member's numbers are contiguous, in this order. No seasonal arrays: the ensemble
builds its members with ``season_buckets=0`` (:func:`params_vector` refuses others).
Parameters are a float64 vector too (:func:`params_vector`, offsets ``P_*`` and, per
tail, ``TP_*``), read from a reference detector so any constructor arguments carry over.

Exactness
---------
The kernel mirrors the reference expression by expression, with Python's ``min``/``max``
semantics (:func:`_min`, :func:`_max`) and the same libm calls, so scores and states
agree to the bit on the tested data. One trap: CPython computes ``x ** 2`` with libm's
``pow``, which is not always correctly rounded (about 1 in 1,200 random ``x`` differs
from ``x * x`` in the last bit), while numba/LLVM turn any ``x ** 2`` into ``x * x``;
:func:`~iotwatch.models.kernels.primitives.libm_pow` calls libm's ``pow`` itself. A deviation that is ``None`` (a view
warming up) is carried as NaN: the reference treats a NaN deviation exactly like
``None`` (tail 1.0, nothing learned), so the sentinel cannot change a result.

Cost
----
``python -m iotwatch.models.kernels.tail_ensemble`` times 200,000 readings of 1,000 interleaved
streams (random order, 200 readings a stream) after warm-up on one core, through the
reference ``score_learn_one`` loop (a dict a reading) and through :func:`score_learn`, and
prints both per reading. A large share of the kernel's time is the four libm ``pow`` calls
kept for exactness. Helper functions take tuples, not arrays: numba counts references of
every array argument atomically, which costs more than the arithmetic.

Examples
--------
Two streams interleaved in one call; stream 1 ends with a spike. The kernel's scores are
those of a reference detector fed stream 1 alone:

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
>>> ref = TailEnsemble()
>>> ref_scores = [ref.score_learn_one({"m": v}, t) for v, t in zip(values[1::2].tolist(), t_ms[1::2].tolist())]
>>> bool(np.array_equal(scores[1::2], ref_scores)), bool(np.array_equal(from_reference(ref), states[1]))
(True, True)
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from iotwatch.errors import UserError
from iotwatch.models.kernels import benchmark, warm_kernel
from iotwatch.models.kernels.primitives import (
    TAIL_CLUSTER_PEAK,
    TAIL_GAP,
    TAIL_INDEX,
    TAIL_N,
    TAIL_PARAMS,
    TAIL_PEAKS,
    TAIL_RATE,
    TAIL_SIZE,
    Floats,
    check_batch,
    jit,
    libm_pow,
    log_tail_score,
    put_initial_tail,
    put_state,
    put_tail_params,
    py_max,
    py_min,
    reading_value,
    repeat_learn,
    repeat_tail,
    tail_learn,
    tail_params,
    tail_state,
    tail_tail,
)
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
    "TAIL_CLUSTER_PEAK",
    "TAIL_GAP",
    "TAIL_INDEX",
    "TAIL_N",
    "TAIL_PEAKS",
    "TAIL_RATE",
    "TAIL_SIZE",
    "TAIL_PARAMS",
    "from_reference",
    "initial_state",
    "params_vector",
    "put_initial_tail",
    "put_tail_params",
    "check_batch",
    "score_learn",
    "score_learn_into",
    "tail_learn",
    "tail_params",
    "tail_state",
    "tail_tail",
    "to_reference",
    "warm",
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
    10,
    11,
    12,
    13,
    14,
    15,
)
P_LEVEL_TAIL = 16
P_CHANGE_TAIL = P_LEVEL_TAIL + TAIL_PARAMS
PARAMS_SIZE = P_CHANGE_TAIL + TAIL_PARAMS

_jit = jit
#: The empty ``surprise`` of :func:`score_learn` (no surprises kept).
_NO_SURPRISE = np.empty(0)


# --- conversion to and from the reference --------------------------------------------------------


def params_vector(detector: TailEnsemble) -> np.ndarray:
    """Every number the kernel's arithmetic needs, read from a reference detector.

    Read from the member objects (not recomputed from the ensemble's arguments), so the
    smoothing constants are the very floats the reference uses, and a detector whose
    members were built differently still gets a matching kernel.
    """
    level, change, stuck = detector._level, detector._change, detector._stuck
    if level.season_buckets or change.season_buckets:
        raise UserError("the kernel has no seasonal baseline: members need season_buckets=0")
    p = np.empty(PARAMS_SIZE)
    p[P_WARMUP] = detector.warmup
    p[P_LEVEL_WARMUP], p[P_LEVEL_A], p[P_LEVEL_CLIP] = level.warmup, level._a, level.clip
    p[P_CHANGE_WARMUP], p[P_CHANGE_ALPHA], p[P_CHANGE_BETA] = change.warmup, change.alpha, change.beta
    p[P_CHANGE_A_VAR], p[P_CHANGE_CLIP], p[P_CHANGE_RESET_AFTER] = change._a_var, change.clip, change.reset_after
    p[P_STUCK_TOLERANCE], p[P_STUCK_A], p[P_STUCK_PRIOR_RATE] = stuck.tolerance, stuck._a, stuck.prior_rate
    p[P_STUCK_PRIOR_READINGS], p[P_STUCK_MAX_RATE] = stuck.prior_readings, stuck.max_repeat_rate
    p[P_STUCK_MIN_REVERSALS] = stuck.min_reversals
    put_tail_params(p, P_LEVEL_TAIL, detector._level_tail)
    put_tail_params(p, P_CHANGE_TAIL, detector._change_tail)
    return p


def initial_state(params: np.ndarray) -> np.ndarray:
    """A fresh stream's row: what an untrained reference detector holds (priors included)."""
    row = np.zeros(STATE_SIZE)
    row[STUCK_RATE] = params[P_STUCK_PRIOR_RATE]
    row[STUCK_LAST] = math.nan
    for base, p_base in ((LEVEL_TAIL, P_LEVEL_TAIL), (CHANGE_TAIL, P_CHANGE_TAIL)):
        put_initial_tail(row, base, params, p_base)
    return row


def from_reference(detector: TailEnsemble) -> np.ndarray:
    """The row holding a reference detector's learned state (exact)."""
    state = detector.to_state()
    level, change, stuck = state["level"], state["change"], state["stuck"]
    row = np.empty(STATE_SIZE)
    row[ENSEMBLE_N] = state["n"]
    row[[LEVEL_N, LEVEL_MU, LEVEL_VAR, LEVEL_RVAR]] = level["n"], level["mu"], level["var"], level["rvar"]
    row[[CHANGE_N, CHANGE_LEVEL, CHANGE_TREND, CHANGE_RVAR, CHANGE_BEYOND]] = (
        change["n"],
        change["level"],
        change["trend"],
        change["rvar"],
        change["beyond"],
    )
    row[[STUCK_N, STUCK_RATE, STUCK_LAST, STUCK_RUN, STUCK_REVERSALS, STUCK_DIRECTION]] = (
        stuck["n"],
        stuck["rate"],
        math.nan if stuck["last"] is None else stuck["last"],
        stuck["run"],
        stuck["reversals"],
        stuck["direction"],
    )
    row[LEVEL_TAIL : LEVEL_TAIL + TAIL_SIZE] = state["level_tail"]
    row[CHANGE_TAIL : CHANGE_TAIL + TAIL_SIZE] = state["change_tail"]
    return row


def to_reference(row: np.ndarray, detector_params: dict[str, Any]) -> TailEnsemble:
    """A reference detector built with ``detector_params`` (``TailEnsemble.get_params()``)
    holding the state of ``row`` (exact): to inspect, persist or cross-check a stream."""
    r = [float(v) for v in np.asarray(row, dtype=np.float64)]
    if len(r) != STATE_SIZE:
        raise ValueError(f"a state row has {STATE_SIZE} numbers, not {len(r)}")
    last = r[STUCK_LAST]
    state = {
        "n": int(r[ENSEMBLE_N]),
        "level": {
            "n": int(r[LEVEL_N]),
            "mu": r[LEVEL_MU],
            "var": r[LEVEL_VAR],
            "rvar": r[LEVEL_RVAR],
            "smu": [],
            "sn": [],
        },
        "change": {
            "n": int(r[CHANGE_N]),
            "level": r[CHANGE_LEVEL],
            "trend": r[CHANGE_TREND],
            "rvar": r[CHANGE_RVAR],
            "season": [],
            "beyond": int(r[CHANGE_BEYOND]),
        },
        "stuck": {
            "n": int(r[STUCK_N]),
            "rate": r[STUCK_RATE],
            "last": None if math.isnan(last) else last,
            "run": int(r[STUCK_RUN]),
            "reversals": r[STUCK_REVERSALS],
            "direction": int(r[STUCK_DIRECTION]),
        },
        "level_tail": r[LEVEL_TAIL : LEVEL_TAIL + TAIL_SIZE],
        "change_tail": r[CHANGE_TAIL : CHANGE_TAIL + TAIL_SIZE],
    }
    return TailEnsemble(**detector_params).set_state(state)


# --- shared helpers: Python's semantics, compiled ------------------------------------------------
#
# Every member below is a pure function of its state and parameters, as tuples of floats in
# the order of the row layout, returning the new state: tuples live in registers, while
# numba reference-counts every array handed to a function (two atomic calls a call, which
# cost more than the arithmetic). Only the ensemble step touches the row.


@_jit
def _scale(var: float, level: float) -> float:
    """``RobustZScore._scale`` and ``HoltWintersResidual._scale`` (the same formula)."""
    return math.sqrt(py_max(var, libm_pow(1e-3 * abs(level) + 1e-9, 2.0)))


# --- RobustZScore (season_buckets=0): state (n, mu, var), params (warmup, a, clip) ---------------------


@_jit
def _zscore_deviation(state: Floats, params: Floats, v: float) -> float:
    n, mu, var = state
    if n < params[0]:
        return math.nan
    return (v - mu) / _scale(var, mu)


@_jit
def _zscore_update(v: float, mu: float, var: float, a_mu: float, a_var: float, clip: float) -> tuple[float, float]:
    scale = _scale(var, mu)
    r = py_min(py_max(v - mu, -clip * scale), clip * scale)
    r_var = py_min(py_max(v - mu, -2.0 * clip * scale), 2.0 * clip * scale)
    return mu + a_mu * r, (1.0 - a_var) * var + a_var * r_var * r_var


@_jit
def _zscore_learn(state: Floats, params: Floats, v: float) -> Floats:
    n, mu, var = state
    warmup, a, clip = params
    n += 1.0
    if n <= warmup:  # plain running moments while warming up
        delta = v - mu
        mu += delta / n
        var += (delta * (v - mu) - var) / n
    else:
        mu, var = _zscore_update(v, mu, var, a, a, clip)
    return n, mu, var


# --- HoltWintersResidual (season_buckets=0): state (n, level, trend, rvar, beyond),
#     params (warmup, alpha, beta, a_var, clip, reset_after) -------------------------------------------


@_jit
def _hw_forecast(level: float, trend: float) -> float:
    return level + trend + 0.0  # + 0.0: the absent season term, added as the reference adds it


@_jit
def _hw_deviation(state: Floats, params: Floats, v: float) -> float:
    n, level, trend, rvar, _ = state
    if n < params[0]:
        return math.nan
    return (v - _hw_forecast(level, trend)) / _scale(rvar, level)


@_jit
def _hw_learn(state: Floats, params: Floats, v: float) -> Floats:
    n, level, trend, rvar, beyond = state
    warmup, alpha, beta, a_var_slow, clip, reset_after = params
    n += 1.0
    if n == 1.0:
        return n, v, trend, rvar, beyond
    season = 0.0
    err = v - _hw_forecast(level, trend)
    err_var = err
    if n > warmup:
        bound = clip * _scale(rvar, level)
        if reset_after != 0.0 and abs(err) > bound:
            side = 1.0 if err > 0 else -1.0
            beyond = beyond + side if beyond * side > 0 else side
            if abs(beyond) >= reset_after:
                return n, v - season, 0.0, rvar, 0.0
        else:
            beyond = 0.0
        err = py_min(py_max(err, -bound), bound)
        err_var = py_min(py_max(err_var, -2.0 * bound), 2.0 * bound)
        a_var = a_var_slow
    else:
        a_var = 1.0 / n
    fitted = _hw_forecast(level, trend) + err
    new_level = alpha * (fitted - season) + (1.0 - alpha) * (level + trend)
    trend = beta * (new_level - level) + (1.0 - beta) * trend
    rvar = (1.0 - a_var) * rvar + a_var * err_var * err_var
    return n, new_level, trend, rvar, beyond


# --- TailEnsemble --------------------------------------------------------------------------------------


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
def _score_learn_one(row: np.ndarray, x: float, members: tuple) -> float:
    """``TailEnsemble.score_learn_one`` on one stream's row."""
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
    level = abs(_zscore_deviation(level_state, level_p, v))  # NaN: None, warming up
    change = abs(_hw_deviation(change_state, change_p, v))
    score = 0.0
    if row[ENSEMBLE_N] >= warmup:
        tail = py_min(
            py_min(tail_tail(level_tail, level_tail_p, level), tail_tail(change_tail, change_tail_p, change)),
            repeat_tail(stuck_state, stuck_p, v),
        )
        score = log_tail_score(py_min(1.0, 3.0 * tail))
    put_state(row, LEVEL_TAIL, tail_learn(level_tail, level_tail_p, level))
    put_state(row, CHANGE_TAIL, tail_learn(change_tail, change_tail_p, change))
    put_state(row, LEVEL_N, _zscore_learn(level_state, level_p, v))
    put_state(row, CHANGE_N, _hw_learn(change_state, change_p, v))
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
    (updated in place): ``TailEnsemble.score_learn_one({"m": values[i]}, t_ms[i])``; the
    ensemble holds nothing, so each reading's surprise is its score, copied to
    ``surprise`` when it has the batch's length (pass an empty array to skip it).

    One call takes a whole micro-batch, many streams interleaved; each stream's readings
    must be in order among themselves. ``states`` is ``(n_streams, STATE_SIZE)`` float64,
    ``stream`` int64 row indices, ``values`` float64, ``t_ms`` int64 event times (unused
    while the ensemble has no seasonal view, kept so the call matches the reference's),
    ``params`` from :func:`params_vector`; C-contiguous arrays of these dtypes use the
    code :func:`warm` compiled (others compile a variant on first use). A non-finite
    value scores 0 and is not learned. Raises on mismatched shapes or a stream index out
    of range, before learning anything.
    """
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


def warm() -> None:
    """Compile (or load from numba's cache) :func:`score_learn` for the job's dtypes, so a
    worker's first micro-batch does not pay for it."""
    warm_kernel(sys.modules[__name__], TailEnsemble())


if __name__ == "__main__":
    print(benchmark(sys.modules[__name__], TailEnsemble))
