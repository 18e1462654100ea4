"""Sequence bookkeeping of every record, compiled: duplicates, lateness, clock steps, resets,
by the contract's at-least-once rules (docs/streaming-internals.md, "Sequence bookkeeping").
"""

from __future__ import annotations

import numpy as np
from numba import njit

from iotwatch.streaming.device_state import (
    CLOCK_STEPS,
    CORE_FIELDS,
    DEAD_LETTERED,
    DUPLICATES,
    LAST_APPEND_MS,
    LATE,
    MAX_EVENT_MS,
    RECEIVED,
    SCORED,
    SEQ_HIGH,
    SEQ_RESETS,
)

#: What a record is (``outcome`` codes). ``OUT_OF_ORDER`` is a reading kept (archived,
#: rules applied) that arrived after a newer seq of its device, within the allowed lateness.
NO_DEVICE, INVALID, DUPLICATE, LATE_RECORD, SCORED_RECORD, OUT_OF_ORDER = 0, 1, 2, 3, 4, 5


@njit(cache=True, nogil=True)
def _test_and_set(words: np.ndarray, seq: int, window: int) -> bool:
    bit = seq % window
    mask = np.uint64(1) << np.uint64(bit % 64)
    seen = bool((words[bit // 64] & mask) != 0)
    words[bit // 64] |= mask
    return seen


@njit(cache=True, nogil=True)
def _advance(words: np.ndarray, high: int, seq: int, window: int) -> None:
    """Forget the seqs a window ago that the slots of ``high+1 .. seq`` held."""
    if seq - high >= window:
        words[:] = 0
        return
    for s in range(high + 1, seq + 1):
        bit = s % window
        words[bit // 64] &= ~(np.uint64(1) << np.uint64(bit % 64))


@njit(cache=True, nogil=True)
def classify(
    device: np.ndarray,
    valid: np.ndarray,
    seq: np.ndarray,
    ts: np.ndarray,
    append_ms: np.ndarray,
    core: np.ndarray,
    seqs: np.ndarray,
    window: int,
    lateness_ms: int,
    outcome: np.ndarray,
    log_gap_ms: np.ndarray,
    newest_ms: np.ndarray,
    prior_newest_ms: np.ndarray,
    prior_high: np.ndarray,
) -> None:
    """Classify each record and update ``core`` (n_devices, CORE) and ``seqs`` (n_devices, words).

    ``device`` is the record's row in ``core`` (-1: no device could be told); ``append_ms``
    the Kafka timestamp (0: none). Out: ``outcome`` per record, ``log_gap_ms`` (time in the
    log since the device's previous record, 0 for its first), ``newest_ms`` (the device's
    newest event time after a scored record), and the device's newest event time and seq
    high-water mark before the record (``prior_newest_ms``, ``prior_high``).
    """
    for i in range(device.shape[0]):
        d = device[i]
        log_gap_ms[i] = 0
        newest_ms[i] = -1
        prior_newest_ms[i] = -1
        prior_high[i] = -1
        if d < 0:
            outcome[i] = NO_DEVICE
            continue
        prior_newest_ms[i] = core[d, MAX_EVENT_MS]
        prior_high[i] = core[d, SEQ_HIGH]
        core[d, RECEIVED] += 1
        stamp = append_ms[i]
        if stamp > 0:
            previous = core[d, LAST_APPEND_MS]
            if previous > 0:
                log_gap_ms[i] = stamp - previous
            if stamp > previous:
                core[d, LAST_APPEND_MS] = stamp
        if not valid[i]:
            core[d, DEAD_LETTERED] += 1
            outcome[i] = INVALID
            continue
        s = seq[i]
        high = core[d, SEQ_HIGH]
        words = seqs[d]
        in_order = s > high
        reset = False
        if in_order:
            _advance(words, high, s, window)
            _test_and_set(words, s, window)
            core[d, SEQ_HIGH] = s
        elif high - s >= window:
            reset = True
            core[d, SEQ_RESETS] += 1
            words[:] = 0
            _test_and_set(words, s, window)
            core[d, SEQ_HIGH] = s
        elif _test_and_set(words, s, window):
            newest = core[d, MAX_EVENT_MS]
            if newest < 0 or ts[i] <= newest:  # a copy of a reading (it carries the original's time)
                core[d, DUPLICATES] += 1
                outcome[i] = DUPLICATE
                continue
            reset = True  # a seq seen before yet newer than anything seen: the device restarted its counter
            core[d, SEQ_RESETS] += 1
            words[:] = 0
            _test_and_set(words, s, window)
            core[d, SEQ_HIGH] = s
        newest = core[d, MAX_EVENT_MS]
        behind = newest >= 0 and ts[i] < newest - lateness_ms
        if behind and (in_order or reset):
            core[d, CLOCK_STEPS] += 1  # the device's clock stepped back: not lateness
        elif behind:
            core[d, LATE] += 1
            outcome[i] = LATE_RECORD
            continue
        if ts[i] > newest:
            core[d, MAX_EVENT_MS] = ts[i]
        core[d, SCORED] += 1
        newest_ms[i] = core[d, MAX_EVENT_MS]
        outcome[i] = SCORED_RECORD if in_order or reset else OUT_OF_ORDER


def warm() -> None:
    """Compile (or load from numba's cache) :func:`classify` now, not in the first batch."""
    empty = np.zeros(0, dtype=np.int64)
    classify(
        empty,
        np.zeros(0, dtype=np.bool_),
        empty,
        empty,
        empty,
        np.zeros((0, len(CORE_FIELDS)), dtype=np.int64),
        np.zeros((0, 1), dtype=np.uint64),
        64,
        0,
        np.zeros(0, dtype=np.int8),
        empty.copy(),
        empty.copy(),
        empty.copy(),
        empty.copy(),
    )
