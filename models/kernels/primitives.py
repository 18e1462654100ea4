"""The one numeric module of the per-reading detectors: compiled primitives every kernel
uses, and the members two detectors share.

- Python's semantics for ``max``, ``min`` and ``**`` (:func:`py_max`, :func:`py_min`,
  :func:`libm_pow`), a reading's value as :class:`iotwatch.models.base.UnivariateMixin`
  takes it (:func:`reading_value`), the primitives of :mod:`iotwatch.models.numeric`
  compiled, and the batch check of every kernel's ``score_learn``;
- the members the detectors share, as pure functions of a state tuple and a parameter
  tuple: the Pareto tail of :class:`iotwatch.models.exceedance.ExceedanceTail`
  (:func:`tail_tail`, :func:`tail_learn`), the run of identical readings of
  :class:`iotwatch.models.repeat_run.RepeatRun` (:func:`repeat_tail`,
  :func:`repeat_learn`), the baseline of :class:`iotwatch.models.robust_zscore.RobustZScore`
  (:func:`zscore_learn`) and the one-step Holt forecast of
  ``tail_ensemble``'s change view (:func:`hw_learn`). Those classes call them one value at
  a time; the kernels call them inside their step.

Exactness: the arithmetic uses Python's ``min``/``max`` semantics and CPython's libm calls,
so the compiled step and the same code run as plain Python give the same floats. One trap:
CPython computes ``x ** 2`` with libm's ``pow``, which is not always correctly rounded (about
1 in 1,200 random ``x`` differs from ``x * x`` in the last bit), while numba/LLVM turn any
``x ** 2`` into ``x * x``; :func:`libm_pow` calls libm's ``pow`` itself, at a large share of a
kernel's time.

State and parameters pass as tuples of floats, not arrays: tuples live in registers, while
numba reference-counts every array handed to a function (two atomic calls a call, which
cost more than the arithmetic). With ``NUMBA_DISABLE_JIT=1`` all of it runs as plain
Python.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic
from numpy.typing import NDArray

from iotwatch.models import numeric
from iotwatch.models.base import VALUE_LIMIT

if TYPE_CHECKING:
    from iotwatch.models.exceedance import ExceedanceTail

__all__ = [
    "TAIL_PARAMS",
    "TAIL_SIZE",
    "check_batch",
    "FloatArray",
    "Floats",
    "IntArray",
    "decay_weight",
    "hw_deviation",
    "hw_learn",
    "jit",
    "libm_pow",
    "log_tail_score",
    "put_initial_tail",
    "put_state",
    "put_tail_params",
    "py_max",
    "py_min",
    "reading_value",
    "repeat_learn",
    "repeat_tail",
    "scale",
    "tail_learn",
    "tail_params",
    "tail_state",
    "tail_tail",
    "upper_tail",
    "zscore_deviation",
    "zscore_learn",
    "zscore_update",
]


#: numba's settings: module globals it sets from the environment at run time, which its stubs
#: do not declare.
_CONFIG: Any = numba.config


def _kernel_cache_dir() -> str:
    """numba's disk cache checks only the file a function is defined in, not the functions
    it calls from other files: a kernel cached before a change to a primitive, to
    :mod:`iotwatch.models.numeric` or to another kernel it calls would go on running the old
    code. So the kernels cache in a folder named by a digest of every source they compile
    from (under ``NUMBA_CACHE_DIR`` when set, else ``~/.cache/iotwatch/numba``)."""
    models = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for source in sorted([*models.glob("kernels/*.py"), models / "numeric.py", models / "base.py"]):
        digest.update(source.name.encode() + source.read_bytes())
    base = _CONFIG.CACHE_DIR or os.path.join(os.path.expanduser("~"), ".cache", "iotwatch", "numba")
    return os.path.join(base, digest.hexdigest()[:16])


_CONFIG.CACHE_DIR = _kernel_cache_dir()

_P = ParamSpec("_P")
_R = TypeVar("_R")


def jit(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """How every kernel function is compiled: cached on disk (:func:`_kernel_cache_dir`),
    without the GIL. Typed as the function it compiles, so a kernel keeps its signature for
    the type checker and a kernel module is a :class:`iotwatch.models.kernels.Kernel`."""
    return numba.njit(cache=True, nogil=True)(function)


#: A member's state or parameters: a tuple of floats (annotation only; numba infers types).
Floats = tuple[float, ...]
#: The kernels' arrays: state rows, parameters, values and scores; stream indices and event times.
FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: An ExceedanceTail block, relative to its base (the order of :func:`tail_learn`'s state).
TAIL_N, TAIL_RATE, TAIL_PEAKS, TAIL_INDEX, TAIL_GAP, TAIL_CLUSTER_PEAK = 0, 1, 2, 3, 4, 5
TAIL_SIZE = 6
#: An ExceedanceTail's parameters, relative to its base.
(TP_THRESHOLD, TP_A, TP_B, TP_PRIOR_RATE, TP_PRIOR_READINGS, TP_PRIOR_INDEX, TP_PRIOR_PEAKS, TP_CLIP, TP_RUN_GAP) = (
    range(9)
)
TAIL_PARAMS = 9

decay_weight = jit(numeric.decay_weight)
log_tail_score = jit(numeric.log_tail_score)
upper_tail = jit(numeric.upper_tail)


@intrinsic
def _libm_pow(typingctx: Any, x: types.Type, y: types.Type) -> tuple[Any, Any]:
    """libm's ``pow(x, y)``, the function CPython's ``x ** y`` calls (see Exactness).

    Declared ``nobuiltin`` so LLVM cannot rewrite ``pow(x, 2.0)`` into ``x * x``.
    """

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fnty = ir.FunctionType(ir.DoubleType(), [ir.DoubleType(), ir.DoubleType()])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "pow")
        fn.attributes.add("nobuiltin")
        return builder.call(fn, args)

    return types.float64(types.float64, types.float64), codegen


def _python_pow(x: float, y: float) -> float:
    """``x ** y`` as CPython computes it (libm's ``pow``): :func:`libm_pow` without the JIT."""
    power: float = x**y
    return power


#: libm's ``pow(x, y)``, the function CPython's ``x ** y`` calls (see Exactness above);
#: plain ``**`` when the JIT is disabled.
#: (Compiled code calls the intrinsic without its typing context: it is typed as it is called.)
libm_pow = _python_pow if _CONFIG.DISABLE_JIT else cast(Callable[[float, float], float], _libm_pow)


@jit
def py_max(a: float, b: float) -> float:
    """Python's ``max(a, b)``: ``a`` unless ``b > a`` (so NaN in ``b`` is ignored)."""
    return b if b > a else a


@jit
def py_min(a: float, b: float) -> float:
    """Python's ``min(a, b)``: ``a`` unless ``b < a``."""
    return b if b < a else a


@jit
def reading_value(x: float) -> float:
    """``UnivariateMixin._value``: NaN (= None) for a non-finite reading, else clipped."""
    if x - x != 0.0:
        return math.nan
    return x if -VALUE_LIMIT <= x <= VALUE_LIMIT else math.copysign(VALUE_LIMIT, x)


@jit
def check_batch(
    states: FloatArray,
    stream: IntArray,
    values: FloatArray,
    t_ms: IntArray,
    params: FloatArray,
    state_size: int,
    params_size: int,
) -> int:
    """The batch's length, once its shapes are those a kernel's :func:`score_learn` takes
    and every stream index is a row of ``states`` (checked before any reading is learned)."""
    n: int = values.shape[0]
    if stream.shape[0] != n or t_ms.shape[0] != n:
        raise ValueError("stream, values and t_ms must have the same length")
    if states.shape[1] != state_size or params.shape[0] != params_size:
        raise ValueError("states must be (n_streams, STATE_SIZE) and params of length PARAMS_SIZE")
    rows = states.shape[0]
    for i in range(n):
        if stream[i] < 0 or stream[i] >= rows:
            raise IndexError("stream index out of range of states")
    return n


# --- the level and change members: RobustZScore's baseline (state (n, mu, var), params
#     (warmup, a, clip)) and tail_ensemble's one-step Holt forecast (state (n, level, trend,
#     rvar, beyond), params (warmup, alpha, beta, a_var, clip, reset_after)) -------------------


@jit
def scale(var: float, level: float) -> float:
    """A residual scale: ``sqrt(var)``, floored at 0.1 % of the level (a constant stream)."""
    return math.sqrt(py_max(var, libm_pow(1e-3 * abs(level) + 1e-9, 2.0)))


@jit
def zscore_deviation(state: Floats, params: Floats, v: float) -> float:
    """The signed z of ``v`` against the baseline (NaN while warming up)."""
    n, mu, var = state
    if n < params[0]:
        return math.nan
    return (v - mu) / scale(var, mu)


@jit
def zscore_update(v: float, mu: float, var: float, a_mu: float, a_var: float, clip: float) -> tuple[float, float]:
    """A mean and variance once ``v`` is learned, the residual clipped to ``clip`` scales
    (to twice that for the variance)."""
    s = scale(var, mu)
    r = py_min(py_max(v - mu, -clip * s), clip * s)
    r_var = py_min(py_max(v - mu, -2.0 * clip * s), 2.0 * clip * s)
    return mu + a_mu * r, (1.0 - a_var) * var + a_var * r_var * r_var


@jit
def zscore_learn(state: Floats, params: Floats, v: float) -> Floats:
    """The baseline once ``v`` is learned: plain running moments while warming up, then
    exponentially weighted and clipped."""
    n, mu, var = state
    warmup, a, clip = params
    n += 1.0
    if n <= warmup:  # plain running moments while warming up
        delta = v - mu
        mu += delta / n
        var += (delta * (v - mu) - var) / n
    else:
        mu, var = zscore_update(v, mu, var, a, a, clip)
    return n, mu, var


@jit
def hw_deviation(state: Floats, params: Floats, v: float) -> float:
    """The signed one-step forecast residual of ``v`` in residual scales (NaN while warming up)."""
    n, level, trend, rvar, _ = state
    if n < params[0]:
        return math.nan
    return (v - (level + trend)) / scale(rvar, level)


@jit
def hw_learn(state: Floats, params: Floats, v: float) -> Floats:
    """The forecaster once ``v`` is learned (level and trend, no season). Past warm-up the
    residual is clipped to ``clip`` scales; ``reset_after`` clipped residuals in a row on
    one side move the level to the reading."""
    n, level, trend, rvar, beyond = state
    warmup, alpha, beta, a_var_slow, clip, reset_after = params
    n += 1.0
    if n == 1.0:
        return n, v, trend, rvar, beyond
    forecast = level + trend
    err = v - forecast
    err_var = err
    if n > warmup:
        bound = clip * scale(rvar, level)
        if reset_after != 0.0 and abs(err) > bound:
            side = 1.0 if err > 0 else -1.0
            beyond = beyond + side if beyond * side > 0 else side
            if abs(beyond) >= reset_after:
                return n, v, 0.0, rvar, 0.0
        else:
            beyond = 0.0
        err = py_min(py_max(err, -bound), bound)
        err_var = py_min(py_max(err_var, -2.0 * bound), 2.0 * bound)
        a_var = a_var_slow
    else:
        a_var = 1.0 / n
    fitted = forecast + err
    new_level = alpha * fitted + (1.0 - alpha) * (level + trend)
    trend = beta * (new_level - level) + (1.0 - beta) * trend
    rvar = (1.0 - a_var) * rvar + a_var * err_var * err_var
    return n, new_level, trend, rvar, beyond


# --- RepeatRun: state (n, rate, last, run, reversals, direction),
#     params (tolerance, a, prior_readings, max_repeat_rate, min_reversals) -----------------------------


@jit
def repeat_run_length(state: Floats, params: Floats, v: float) -> float:
    last, run = state[2], state[3]
    return run + 1.0 if not math.isnan(last) and abs(v - last) <= params[0] else 0.0


@jit
def repeat_judged(state: Floats, params: Floats) -> bool:
    return state[1] <= params[3] and state[4] >= params[4]


@jit
def repeat_tail(state: Floats, params: Floats, v: float) -> float:
    """Probability of a run at least this long, were repeats independent at the stream's
    rate (1.0 when ``v`` ends no run or the stream is not judged)."""
    run = repeat_run_length(state, params, v)
    if run == 0.0 or not repeat_judged(state, params):
        return 1.0
    return math.exp(run * math.log(py_max(state[1], 1e-6)))


@jit
def repeat_learn(state: Floats, params: Floats, v: float) -> Floats:
    """The run detector's state once ``v`` is learned."""
    run = repeat_run_length(state, params, v)
    n, rate, last, _, reversals, direction = state
    _, a_min, prior_readings, _, _ = params
    if not math.isnan(last):
        n += 1.0
        a = py_max(1.0 / (n + prior_readings), a_min)
        rate += a * ((1.0 if run != 0.0 else 0.0) - rate)
        if run == 0.0:
            change = 1.0 if v > last else -1.0
            if direction != 0.0:
                reversals += a * ((1.0 if change != direction else 0.0) - reversals)
            direction = change
    return n, rate, v, run, reversals, direction


# --- ExceedanceTail: state (n, rate, peaks, index, gap, cluster_peak),
#     params (threshold, a, b, prior_readings, prior_peaks, clip, run_gap) ------------------------------


@jit
def tail_tail(state: Floats, params: Floats, d: float) -> float:
    """``P(deviation >= d)`` under the fitted tail (1.0 at or below the threshold; NaN: a
    view warming up, 1.0)."""
    if math.isnan(d):
        return 1.0
    threshold = params[0]
    if d <= threshold:
        return 1.0
    if math.isinf(d):
        return 0.0
    rate, index = state[1], state[3]
    return py_min(1.0, rate * math.exp(-math.log(d / threshold) / py_max(index, 1e-6)))


@jit
def tail_learn(state: Floats, params: Floats, d: float) -> Floats:
    """The tail's state once one reading's deviation ``d`` is counted (a non-finite one is not)."""
    if not math.isfinite(d):
        return state
    n, rate, peaks, index, gap, cluster_peak = state
    threshold, a_min, _, prior_readings, _, _, run_gap = params
    n += 1.0
    a = py_max(1.0 / (n + prior_readings), a_min)
    if d <= threshold:
        rate -= a * rate
        gap = py_min(gap + 1.0, run_gap)
        if cluster_peak != 0.0 and gap >= run_gap:
            peaks, index = _tail_learn_peak(peaks, index, params, cluster_peak)
            cluster_peak = 0.0
        return n, rate, peaks, index, gap, cluster_peak
    starts_cluster = gap >= run_gap
    gap = 0.0
    rate += a * ((1.0 if starts_cluster else 0.0) - rate)
    if run_gap <= 0:
        peaks, index = _tail_learn_peak(peaks, index, params, d)
    else:
        cluster_peak = py_max(cluster_peak, d)
    return n, rate, peaks, index, gap, cluster_peak


@jit
def _tail_learn_peak(peaks: float, index: float, params: Floats, d: float) -> tuple[float, float]:
    threshold, _, b_min, _, prior_peaks, clip, _ = params
    peaks += 1.0
    b = py_max(1.0 / (peaks + prior_peaks), b_min)
    log_excess = py_min(math.log(d / threshold), clip * index)
    return peaks, index + b * (log_excess - index)


@jit
def tail_params(p: FloatArray, q: int) -> Floats:
    """The tuple :func:`tail_tail` and :func:`tail_learn` take, from a tail's parameters at ``p[q:]``."""
    return (
        p[q + TP_THRESHOLD],
        p[q + TP_A],
        p[q + TP_B],
        p[q + TP_PRIOR_READINGS],
        p[q + TP_PRIOR_PEAKS],
        p[q + TP_CLIP],
        p[q + TP_RUN_GAP],
    )


@jit
def tail_state(row: FloatArray, base: int) -> Floats:
    """A tail's state tuple, from its block at ``row[base:]``."""
    return (
        row[base + TAIL_N],
        row[base + TAIL_RATE],
        row[base + TAIL_PEAKS],
        row[base + TAIL_INDEX],
        row[base + TAIL_GAP],
        row[base + TAIL_CLUSTER_PEAK],
    )


@jit
def put_state(row: FloatArray, first: int, state: Floats) -> None:
    """Write a member's state back to its (contiguous) offsets, starting at ``first``."""
    for k in range(len(state)):
        row[first + k] = state[k]


def put_tail_params(p: FloatArray, base: int, tail: ExceedanceTail) -> None:
    """An :class:`~iotwatch.models.exceedance.ExceedanceTail`'s parameters at ``p[base:base + TAIL_PARAMS]``
    (offsets ``TP_*``): any kernel with such a tail reads them with :func:`tail_params`."""
    p[base : base + TAIL_PARAMS] = (
        tail.threshold,
        tail._a,
        tail._b,
        tail.prior_rate,
        tail.prior_readings,
        tail.prior_index,
        tail.prior_peaks,
        tail.clip,
        tail.run_gap,
    )


def put_initial_tail(row: FloatArray, base: int, params: FloatArray, p_base: int) -> None:
    """A fresh tail's state (its priors) at ``row[base:base + TAIL_SIZE]``, the row zeroed."""
    row[base + TAIL_RATE] = params[p_base + TP_PRIOR_RATE]
    row[base + TAIL_INDEX] = params[p_base + TP_PRIOR_INDEX]
    row[base + TAIL_GAP] = params[p_base + TP_RUN_GAP]
