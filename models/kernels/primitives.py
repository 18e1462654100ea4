"""Compiled primitives every kernel uses: Python's semantics for ``max``, ``min`` and ``**``,
a reading's value as the reference detectors take it, the shared numeric primitives of
:mod:`iotwatch.models.numeric` compiled, and the batch check of ``score_learn``.

Kernels compute the same floats as their reference detectors (see
:mod:`iotwatch.models.kernels.tail_ensemble`, Exactness); these are the pieces that make it so.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from iotwatch.models import numeric
from iotwatch.models.base import VALUE_LIMIT

__all__ = ["check_batch", "decay_weight", "jit", "libm_pow", "py_max", "py_min", "reading_value", "upper_tail"]

#: How every kernel function is compiled: cached on disk, without the GIL.
jit = numba.njit(cache=True, nogil=True)

decay_weight = jit(numeric.decay_weight)
upper_tail = jit(numeric.upper_tail)


@intrinsic
def libm_pow(typingctx: Any, x: types.Type, y: types.Type) -> tuple[Any, Any]:
    """libm's ``pow(x, y)``, the function CPython's ``x ** y`` calls (see Exactness).

    Declared ``nobuiltin`` so LLVM cannot rewrite ``pow(x, 2.0)`` into ``x * x``.
    """

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fnty = ir.FunctionType(ir.DoubleType(), [ir.DoubleType(), ir.DoubleType()])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "pow")
        fn.attributes.add("nobuiltin")
        return builder.call(fn, args)

    return types.float64(types.float64, types.float64), codegen


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
    states: np.ndarray,
    stream: np.ndarray,
    values: np.ndarray,
    t_ms: np.ndarray,
    params: np.ndarray,
    state_size: int,
    params_size: int,
) -> int:
    """The batch's length, once its shapes are those a kernel's :func:`score_learn` takes
    and every stream index is a row of ``states`` (checked before any reading is learned)."""
    n = values.shape[0]
    if stream.shape[0] != n or t_ms.shape[0] != n:
        raise ValueError("stream, values and t_ms must have the same length")
    if states.shape[1] != state_size or params.shape[0] != params_size:
        raise ValueError("states must be (n_streams, STATE_SIZE) and params of length PARAMS_SIZE")
    rows = states.shape[0]
    for i in range(n):
        if stream[i] < 0 or stream[i] >= rows:
            raise IndexError("stream index out of range of states")
    return n
