"""CAD OSE, the contextual anomaly detector: the arithmetic of
:class:`iotwatch.models.cad_ose.CadOse` and of NAB's published run of it
(:func:`iotwatch.models.cad_ose.nab_scores`), one float64 row per stream.

CAD OSE's context memory (its semi-contexts, the contexts joining them, the order each
dict iterates) lives in a fixed row sized by a capacity of contexts (:func:`state_size`;
:data:`CONTEXTS` for the catalogued detector, :data:`STATE_SIZE` numbers). :data:`FACTS`
and :data:`RIGHTS` bound ``value_bits + max_active_neurons`` and ``value_bits``
(:func:`params_vector` refuses larger ones).

State layout
------------
With ``C`` contexts of capacity (``next = CONTEXT + 6 C``, ``left = next + C``,
``right = left + LEFT_WIDTH C``, ``index = right + 3 RIGHTS``):

=====================  ==========================================================
``N``, ``LOW``,        readings seen and the range of the first ``range_readings``
``HIGH``, ``STARTED``  (widened by any reading beyond it, with ``widen_range``);
                       ``STARTED`` is 1 once the range is set and the memory runs
``SINCE``              raw scores since the last of ``base_threshold`` or more
``N_CONTEXTS``,        contexts, left and right semi-contexts stored
``N_LEFT``,
``N_RIGHT``
``N_LEFT_FACTS``,      the last step's left facts (sensor facts ``2 * bit + value``,
``LEFT_FACTS + k``     then neuron facts ``NEURON_BASE + context``), ascending
``CONTEXT + 6 c + k``  context ``c``: left id, right id, selected, hits, active,
                       zero level
``next + c``           the next context of the same left semi-context in the order its
                       dict iterates (-1: none; kept so at each new context)
``left + w l + k``     left semi-context ``l`` (``w`` = :data:`LEFT_WIDTH`): its facts'
                       count, the hash's high and low 32 bits, its first context, the
                       bits of its facts the last left facts hold, then its facts
``right + 3 r + k``    right semi-context ``r``: its facts as a bit mask (fact ``f``
                       is bit ``f``), the hash's high and low 32 bits
``index + i``          the left semi-contexts by hash (open addressing over ``2 C``
                       slots; ``id + 1``)
=====================  ==========================================================

The published algorithm's output depends on its Python 2 runtime in two places: the hash
of a tuple of facts (it breaks ties between active contexts) and the iteration order of
a small dict of integers (it numbers new contexts). Both are computed here as CPython 2.7
on 64 bits computes them (:func:`py2_tuple_hash`, :func:`py2_dict_order`); hashes are
kept as two exact 32-bit halves and a semi-context is found by its hash.

docs/detection.md has the row's size and what a reading costs (it crosses its facts with
every stored semi-context, as the published algorithm does).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from iotwatch.errors import UserError
from iotwatch.models.kernels.primitives import check_batch, jit, reading_value

if TYPE_CHECKING:
    from iotwatch.models.cad_ose import CadOse

__all__ = [
    "CONTEXTS",
    "FACTS",
    "NEURON_BASE",
    "PARAMS_SIZE",
    "RIGHTS",
    "STATE_SIZE",
    "given_range_scores",
    "initial_state",
    "params_vector",
    "py2_dict_order",
    "py2_tuple_hash",
    "score_learn",
    "score_learn_into",
    "state_size",
]

#: Capacity of the catalogued detector's row: contexts (and so left semi-contexts), facts
#: of a left semi-context, right semi-contexts (every set of sensor facts of ``value_bits``
#: <= 3 bits).
CONTEXTS = 1024
FACTS = 18
RIGHTS = 64
#: Neuron facts are ``NEURON_BASE + context``, above every sensor fact.
NEURON_BASE = 2**31

N, LOW, HIGH, STARTED, SINCE, N_CONTEXTS, N_LEFT, N_RIGHT, N_LEFT_FACTS = range(9)
LEFT_FACTS = 9
CONTEXT = LEFT_FACTS + FACTS
C_LEFT, C_RIGHT, C_SELECTED, C_HITS, C_ACTIVE, C_ZERO = range(6)
L_SIZE, L_HI, L_LO, L_FIRST, L_CROSSED, L_FACTS = range(6)
LEFT_WIDTH = L_FACTS + FACTS
#: Numbers a context of capacity adds to a row: its six counts, its next, its left
#: semi-context, two index slots.
PER_CONTEXT = 6 + 1 + LEFT_WIDTH + 2


@jit
def state_size(contexts: int) -> int:
    """Numbers in a row holding up to ``contexts`` contexts."""
    return CONTEXT + PER_CONTEXT * contexts + 3 * RIGHTS


STATE_SIZE = state_size(CONTEXTS)

(
    P_RANGE_READINGS,
    P_MARGIN,
    P_REST,
    P_BASE_THRESHOLD,
    P_MAX_LEFT,
    P_MAX_ACTIVE,
    P_BITS,
    P_MAX_CONTEXTS,
    P_WIDEN,
) = range(9)
PARAMS_SIZE = 9

_jit = jit
_NO_SURPRISE = np.empty(0)
_LOW32 = 0xFFFFFFFF


def params_vector(detector: CadOse) -> np.ndarray:
    """The detector's parameters; raises when they exceed the row's capacity."""
    if detector.max_contexts > CONTEXTS or detector.value_bits + detector.max_active_neurons > FACTS:
        raise UserError(
            f"the cad_ose kernel holds {CONTEXTS} contexts and {FACTS} left facts: "
            f"max_contexts={detector.max_contexts}, value_bits + max_active_neurons="
            f"{detector.value_bits + detector.max_active_neurons} do not fit"
        )
    if 2 ** (2 * detector.value_bits) > RIGHTS:
        raise UserError(f"the cad_ose kernel holds value_bits <= 3, not {detector.value_bits}")
    return np.array(
        [
            detector.range_readings,
            detector.margin,
            int(detector.rest_period),
            detector.base_threshold,
            detector.max_left_length,
            detector.max_active_neurons,
            detector.value_bits,
            detector.max_contexts,
            1.0 if detector.widen_range else 0.0,
        ],
        dtype=np.float64,
    )


def initial_state(params: np.ndarray, contexts: int = CONTEXTS) -> np.ndarray:
    """A fresh stream's row, holding up to ``contexts`` contexts."""
    row = np.zeros(state_size(contexts))
    row[LOW], row[HIGH] = math.inf, -math.inf
    row[CONTEXT + 6 * contexts : CONTEXT + 7 * contexts] = -1.0
    return row


# --- the step --------------------------------------------------------------------------------


@_jit
def _layout(row: np.ndarray) -> tuple[int, int, int, int, int, int]:
    """A row's capacity of contexts and the offsets of its sized parts: next, left, right,
    index, and the index's slots."""
    contexts = (row.shape[0] - CONTEXT - 3 * RIGHTS) // PER_CONTEXT
    nxt = CONTEXT + 6 * contexts
    lft = nxt + contexts
    rgt = lft + LEFT_WIDTH * contexts
    index = rgt + 3 * RIGHTS
    return contexts, nxt, lft, rgt, index, 2 * contexts


@_jit
def _hash(facts: np.ndarray, count: int) -> tuple[int, int]:
    """CPython 2.7's ``hash(tuple(facts[:count]))`` on a 64-bit build (an int hashes to
    itself there; the original breaks ties between active contexts by these hashes): its
    high (signed) and low 32 bits, so that ``(high, low)`` orders as the signed 64-bit hash
    does."""
    x = np.uint64(0x345678)
    mult = np.uint64(1000003)
    n = count
    for k in range(count):
        n -= 1
        x = (x ^ np.uint64(np.int64(facts[k]))) * mult
        mult = mult + np.uint64(82520 + n + n)
    x = x + np.uint64(97531)
    if x == np.uint64(0xFFFFFFFFFFFFFFFF):
        x = np.uint64(0xFFFFFFFFFFFFFFFE)
    hi = np.int64(x >> np.uint64(32))
    if hi >= 2**31:
        hi -= 2**32
    return int(hi), int(np.int64(x & np.uint64(_LOW32)))


@_jit
def _mask_facts(mask: int, out: np.ndarray) -> int:
    """The sensor facts of a right mask into ``out``, ascending: their count."""
    count = 0
    for f in range(2 * 3):
        if mask >> f & 1:
            out[count] = f
            count += 1
    return count


@_jit
def _popcount(mask: int) -> int:
    count = 0
    while mask:
        count += mask & 1
        mask >>= 1
    return count


@_jit
def _find_left(row: np.ndarray, hi: int, lo: int) -> int:
    """The left semi-context with this hash (-1: none), through the index."""
    _, _, lft, _, index, slots = _layout(row)
    slot = lo % slots
    while row[index + slot] != 0.0:
        lid = int(row[index + slot]) - 1
        base = lft + LEFT_WIDTH * lid
        if row[base + L_HI] == hi and row[base + L_LO] == lo:
            return lid
        slot = (slot + 1) % slots
    return -1


@_jit
def _index_left(row: np.ndarray, lid: int, lo: int) -> None:
    _, _, _, _, index, slots = _layout(row)
    slot = lo % slots
    while row[index + slot] != 0.0:
        slot = (slot + 1) % slots
    row[index + slot] = lid + 1


@_jit
def _find_right(row: np.ndarray, hi: int, lo: int) -> int:
    _, _, _, rgt, _, _ = _layout(row)
    for rid in range(int(row[N_RIGHT])):
        base = rgt + 3 * rid
        if row[base + 1] == hi and row[base + 2] == lo:
            return rid
    return -1


@_jit
def _find(row: np.ndarray, lhi: int, llo: int, rhi: int, rlo: int) -> int:
    """The stored context with sides of these hashes (-1: unknown)."""
    _, nxt, lft, _, _, _ = _layout(row)
    lid = _find_left(row, lhi, llo)
    rid = _find_right(row, rhi, rlo)
    if lid < 0 or rid < 0:
        return -1
    c = int(row[lft + LEFT_WIDTH * lid + L_FIRST])
    while c >= 0:
        if row[CONTEXT + 6 * c + C_RIGHT] == rid:
            return c
        c = int(row[nxt + c])
    return -1


@_jit
def _store(
    row: np.ndarray,
    p: np.ndarray,
    left: np.ndarray,
    n_left: int,
    lhi: int,
    llo: int,
    right_mask: int,
    rhi: int,
    rlo: int,
    zero: float,
    tables: np.ndarray,
) -> int:
    """Store an unknown context (its left and right semi-contexts too when new): its id
    (-1: ``max_contexts`` are stored, no more are)."""
    _, _, lft, rgt, _, _ = _layout(row)
    c = int(row[N_CONTEXTS])
    if c >= p[P_MAX_CONTEXTS]:
        return -1
    lid = _find_left(row, lhi, llo)
    if lid < 0:
        lid = int(row[N_LEFT])
        row[N_LEFT] = lid + 1
        base = lft + LEFT_WIDTH * lid
        row[base + L_SIZE], row[base + L_HI], row[base + L_LO] = n_left, lhi, llo
        row[base + L_FIRST], row[base + L_CROSSED] = -1.0, 0.0
        for k in range(n_left):
            row[base + L_FACTS + k] = left[k]
        _index_left(row, lid, llo)
    rid = _find_right(row, rhi, rlo)
    if rid < 0:
        rid = int(row[N_RIGHT])
        row[N_RIGHT] = rid + 1
        row[rgt + 3 * rid], row[rgt + 3 * rid + 1], row[rgt + 3 * rid + 2] = right_mask, rhi, rlo
    row[N_CONTEXTS] = c + 1
    base = CONTEXT + 6 * c
    row[base + C_LEFT], row[base + C_RIGHT] = lid, rid
    row[base + C_SELECTED] = row[base + C_HITS] = row[base + C_ACTIVE] = 0.0
    row[base + C_ZERO] = zero
    _reorder(row, lid, c, tables)
    return c


@_jit
def _reorder(row: np.ndarray, lid: int, new: int, tables: np.ndarray) -> None:
    """Chain the contexts of left semi-context ``lid``, ``new`` among them, in the order
    CPython 2.7 iterates its dict of right id -> context (:func:`_py2_table`;
    stored in id order, so the ids sorted are the insertion order)."""
    _, nxt, lft, _, _, _ = _layout(row)
    ids = tables[2]
    count = 0
    c = int(row[lft + LEFT_WIDTH * lid + L_FIRST])
    while c >= 0:
        ids[count] = c
        count += 1
        c = int(row[nxt + c])
    ids[count] = new
    count += 1
    ids[:count].sort()
    keys = tables[3]
    for k in range(count):
        keys[k] = int(row[CONTEXT + 6 * ids[k] + C_RIGHT])
    size = _py2_table(keys, ids, count, tables)
    table_keys, table_ids = tables[0], tables[1]
    previous = lft + LEFT_WIDTH * lid + L_FIRST
    for k in range(size):
        if table_keys[k] >= 0:
            row[previous] = table_ids[k]
            previous = nxt + table_ids[k]
    row[previous] = -1.0


@_jit
def _py2_table(keys: np.ndarray, values: np.ndarray, count: int, tables: np.ndarray) -> int:
    """CPython 2.7's dict of ``keys[:count]`` (small non-negative ints, inserted in that order,
    never deleted) -> ``values``: open addressing over a power-of-two table (``i = 5 i +
    perturb + 1``, ``perturb >>= 5``), grown to the smallest power of two above four times
    the keys once two thirds are filled. Its table goes to ``tables[0]`` (keys, -1: free)
    and ``tables[1]`` (values); the result is the table's size, so reading the slots in
    order iterates the dict as CPython 2.7 does."""
    table_keys, table_ids = tables[0], tables[1]
    size = 8
    table_keys[:size] = -1
    for used in range(1, count + 1):
        _py2_insert(table_keys, table_ids, size, keys[used - 1], values[used - 1])
        if used * 3 >= size * 2:
            grown = 8
            while grown <= 4 * used:
                grown <<= 1
            old_keys, old_ids = table_keys[8 * RIGHTS : 8 * RIGHTS + size], table_ids[8 * RIGHTS : 8 * RIGHTS + size]
            old_keys[:] = table_keys[:size]
            old_ids[:] = table_ids[:size]
            table_keys[:grown] = -1
            for k in range(size):
                if old_keys[k] >= 0:
                    _py2_insert(table_keys, table_ids, grown, old_keys[k], old_ids[k])
            size = grown
    return size


@_jit
def _py2_insert(table_keys: np.ndarray, table_ids: np.ndarray, size: int, key: int, ident: int) -> None:
    mask = size - 1
    i = key & mask
    perturb = key
    while table_keys[i & mask] >= 0:
        i = (i << 2) + i + perturb + 1
        perturb >>= 5
    table_keys[i & mask] = key
    table_ids[i & mask] = ident


@_jit
def _same(a: np.ndarray, na: int, b: np.ndarray, nb: int) -> bool:
    if na != nb:
        return False
    for k in range(na):
        if a[k] != b[k]:
            return False
    return True


@_jit
def _step(row: np.ndarray, p: np.ndarray, sensed: int, scratch: np.ndarray, tables: np.ndarray) -> tuple[float, float]:
    """Learn one step's sensor facts (a mask), in the published order: store the
    zero-level context (the last step's left facts followed by these); update every context
    whose left side the last step fully held; take as neurons the ``max_active_neurons``
    contexts that came true, most often active first (ties broken by the sides' hashes);
    store the candidate contexts not known yet while there is room; cross this step's left
    facts with the left semi-contexts. Returns the share of selected contexts that came
    true and the share of candidate contexts that were new."""
    _, nxt, lft, rgt, _, _ = _layout(row)
    n_sensed = _popcount(sensed)
    sensed_facts = np.empty(6)
    _mask_facts(sensed, sensed_facts)
    n_left_facts = int(row[N_LEFT_FACTS])
    left_facts = row[LEFT_FACTS : LEFT_FACTS + n_left_facts].copy()
    # the zero-level context: the last step's left facts, then this step's
    new_flag = False
    new_context = 0
    zhi = zlo = shi = slo = 0
    if n_left_facts > 0 and n_sensed > 0:
        zhi, zlo = _hash(left_facts, n_left_facts)
        shi, slo = _hash(sensed_facts, n_sensed)
        c = _find(row, zhi, zlo, shi, slo)
        if c >= 0:
            row[CONTEXT + 6 * c + C_ZERO] = 1.0
        else:
            new_flag = True
            new_context = _store(row, p, left_facts, n_left_facts, zhi, zlo, sensed, shi, slo, 1.0, tables)
    # the right crossing: update the contexts the last left facts fully held
    active_id = scratch[0]
    active_key = scratch[1:6]
    cand_left = scratch[6]
    cand_mask = scratch[7]
    cand_right = scratch[8]
    crossed = np.empty(FACTS)
    selected = 0
    n_active = 0
    n_cand = 0
    for lid in range(int(row[N_LEFT])):
        base = lft + LEFT_WIDTH * lid
        n_crossed = _popcount(int(row[base + L_CROSSED]))
        if n_crossed == 0:
            continue
        full = row[base + L_SIZE] == n_crossed
        short = n_crossed <= p[P_MAX_LEFT]
        following = int(row[base + L_FIRST])
        while following >= 0:  # the contexts it begins, in its dict's order
            c = following
            following = int(row[nxt + c])
            if c == new_context:
                continue
            cb = CONTEXT + 6 * c
            rid = int(row[cb + C_RIGHT])
            right_mask = int(row[rgt + 3 * rid])
            right_size = _popcount(right_mask)
            right_crossed = _popcount(right_mask & sensed)
            if full:
                selected += 1
                row[cb + C_SELECTED] += right_size
                if right_crossed > 0:
                    row[cb + C_HITS] += right_crossed
                    if right_size == right_crossed:
                        row[cb + C_ACTIVE] += 1.0
                        active_id[n_active] = c
                        active_key[0, n_active] = row[cb + C_ACTIVE]
                        active_key[1, n_active] = row[base + L_HI]
                        active_key[2, n_active] = row[base + L_LO]
                        active_key[3, n_active] = row[rgt + 3 * rid + 1]
                        active_key[4, n_active] = row[rgt + 3 * rid + 2]
                        n_active += 1
                        continue
                    if row[cb + C_ZERO] != 0.0 and new_flag and short:
                        cand_left[n_cand], cand_mask[n_cand] = lid, row[base + L_CROSSED]
                        cand_right[n_cand] = right_mask & sensed
                        n_cand += 1
            elif row[cb + C_ZERO] != 0.0 and new_flag and right_crossed > 0 and short:
                cand_left[n_cand], cand_mask[n_cand] = lid, row[base + L_CROSSED]
                cand_right[n_cand] = right_mask & sensed
                n_cand += 1
    active_share = n_active / float(selected) if selected > 0 else 0.0
    # the active neurons: the max_active_neurons highest (active, left hash, right hash)
    chosen = np.zeros(n_active, dtype=np.bool_)
    neurons = np.empty(FACTS)
    n_neurons = 0
    for _ in range(min(int(p[P_MAX_ACTIVE]), n_active)):
        best = -1
        for a in range(n_active):
            if chosen[a]:
                continue
            if best < 0:
                best = a
                continue
            for j in range(5):
                if active_key[j, a] != active_key[j, best]:
                    if active_key[j, a] > active_key[j, best]:
                        best = a
                    break
        chosen[best] = True
        neurons[n_neurons] = active_id[best]
        n_neurons += 1
    neurons[:n_neurons].sort()
    row[N_LEFT_FACTS] = n_sensed + n_neurons
    for k in range(n_sensed):
        row[LEFT_FACTS + k] = sensed_facts[k]
    for k in range(n_neurons):
        row[LEFT_FACTS + n_sensed + k] = NEURON_BASE + neurons[k]
    row[LEFT_FACTS + n_sensed + n_neurons : LEFT_FACTS + FACTS] = 0.0  # unused slots hold 0
    # the candidates: count the distinct ones (with the zero-level context), store the unknown
    unique = 1 if new_flag else 0
    unknown = 0
    other = np.empty(FACTS)
    right_facts = np.empty(6)
    hashes = np.empty((4, n_cand), dtype=np.int64)
    unstored = np.zeros(n_cand, dtype=np.bool_)
    for i in range(n_cand):
        n_l = _left_crossed_with(row, int(cand_left[i]), int(cand_mask[i]), crossed)
        n_r = _mask_facts(int(cand_right[i]), right_facts)
        lhi, llo = _hash(crossed, n_l)
        rhi, rlo = _hash(right_facts, n_r)
        hashes[0, i], hashes[1, i], hashes[2, i], hashes[3, i] = lhi, llo, rhi, rlo
        # equal tuples have equal hashes: compare the facts only where the hashes agree
        seen = (
            new_flag
            and lhi == zhi
            and llo == zlo
            and int(cand_right[i]) == sensed
            and _same(crossed, n_l, left_facts, n_left_facts)
        )
        for j in range(i):
            if seen:
                break
            if hashes[0, j] == lhi and hashes[1, j] == llo and cand_right[j] == cand_right[i]:
                n_o = _left_crossed_with(row, int(cand_left[j]), int(cand_mask[j]), other)
                seen = _same(crossed, n_l, other, n_o)
        if not seen:
            unique += 1
    for i in range(n_cand):
        lhi, llo, rhi, rlo = hashes[0, i], hashes[1, i], hashes[2, i], hashes[3, i]
        if _find(row, lhi, llo, rhi, rlo) >= 0:
            continue
        repeat = False
        for j in range(i):
            same = hashes[0, j] == lhi and hashes[1, j] == llo and hashes[2, j] == rhi and hashes[3, j] == rlo
            if unstored[j] and same:
                repeat = True
                break
        if repeat:
            continue
        unknown += 1
        n_l = _left_crossed_with(row, int(cand_left[i]), int(cand_mask[i]), crossed)
        if _store(row, p, crossed, n_l, lhi, llo, int(cand_right[i]), rhi, rlo, 0.0, tables) < 0:
            unstored[i] = True
    # the left crossing with this step's left facts
    n_new = int(row[N_LEFT_FACTS])
    new_left = row[LEFT_FACTS : LEFT_FACTS + n_new]
    for lid in range(int(row[N_LEFT])):
        base = lft + LEFT_WIDTH * lid
        mask = 0
        j = 0
        for k in range(int(row[base + L_SIZE])):
            f = row[base + L_FACTS + k]
            while j < n_new and new_left[j] < f:
                j += 1
            if j < n_new and new_left[j] == f:
                mask |= 1 << k
        row[base + L_CROSSED] = mask
    added = unknown + (1 if new_flag else 0)
    new_share = added / float(unique) if new_flag and unique > 0 else 0.0
    return active_share, new_share


@_jit
def _left_crossed_with(row: np.ndarray, lid: int, mask: int, out: np.ndarray) -> int:
    """The facts of left semi-context ``lid`` at the bits of ``mask``, ascending: their count."""
    _, _, lft, _, _, _ = _layout(row)
    base = lft + LEFT_WIDTH * lid
    count = 0
    for k in range(int(row[base + L_SIZE])):
        if mask >> k & 1:
            out[count] = row[base + L_FACTS + k]
            count += 1
    return count


@_jit
def _forget(row: np.ndarray) -> None:
    """Empty the context memory, keeping the readings seen, the range and the start."""
    contexts, nxt, _, _, _, _ = _layout(row)
    row[SINCE:] = 0.0
    row[nxt : nxt + contexts] = -1.0


@_jit
def _cut_range(row: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """The values the levels are cut over: the range widened by ``margin`` of its span each side."""
    span = row[HIGH] - row[LOW]
    return row[LOW] - p[P_MARGIN] * span, row[HIGH] + p[P_MARGIN] * span


@_jit
def _score_learn_one(row: np.ndarray, x: float, p: np.ndarray, scratch: np.ndarray, tables: np.ndarray) -> float:
    """Score, then learn, one reading of one stream: no score until the first
    ``range_readings`` readings set the range, then the published score ``(1 - active share
    + new share) / 2`` of the reading's step number, ``rest_period`` readings of silence
    after one of ``base_threshold`` or more. With ``widen_range``, a reading beyond the range
    widens it to take the reading in, empties the memory (its facts were cut on the old
    range) and scores 1."""
    v = reading_value(x)
    if not math.isfinite(v):
        return 0.0
    row[N] += 1.0
    if row[STARTED] == 0.0:
        if v < row[LOW]:
            row[LOW] = v
        if v > row[HIGH]:
            row[HIGH] = v
        if row[N] >= p[P_RANGE_READINGS]:
            row[STARTED] = 1.0
        return 0.0
    min_value, max_value = _cut_range(row, p)
    widened = p[P_WIDEN] > 0.0 and (v < min_value or v > max_value)
    if widened:
        row[LOW], row[HIGH] = min(row[LOW], v), max(row[HIGH], v)
        _forget(row)
        min_value, max_value = _cut_range(row, p)
    max_bin = 2.0 ** p[P_BITS] - 1.0
    full = max_value - min_value
    width = (full if full != 0.0 else max_bin) / max_bin
    level = int(min(max((v - min_value) / width, 0.0), max_bin))
    sensed = 0
    for k in range(int(p[P_BITS])):
        sensed |= 1 << (2 * k + ((level >> k) & 1))
    active_share, new_share = _step(row, p, sensed, scratch, tables)
    raw = (1.0 - active_share + new_share) / 2.0
    rest = p[P_REST]
    out = raw if 0 < rest <= row[SINCE] else 0.0
    row[SINCE] = 0.0 if raw >= p[P_BASE_THRESHOLD] else row[SINCE] + 1.0
    return 1.0 if widened else out


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
    (updated in place): ``CadOse.score_learn_one({"m": values[i]}, t_ms[i])``; the
    surprise (no hold to lift: the score itself) goes to ``surprise`` when it has the
    batch's length. Raises on mismatched shapes or a stream index out of range, before
    learning anything."""
    contexts = (states.shape[1] - CONTEXT - 3 * RIGHTS) // PER_CONTEXT
    if state_size(contexts) != states.shape[1] or params.shape[0] != PARAMS_SIZE or params[P_MAX_CONTEXTS] > contexts:
        raise ValueError("states must be rows of state_size(contexts) numbers, contexts >= max_contexts")
    n = check_batch(states, stream, values, t_ms, params, states.shape[1], PARAMS_SIZE)
    scratch = np.empty((9, contexts))
    # a dict's table (and its copy while it grows), the context ids and the keys of one left semi-context
    tables = np.empty((4, 16 * RIGHTS), dtype=np.int64)
    out = np.empty(n)
    for i in range(n):
        out[i] = _score_learn_one(states[stream[i]], values[i], params, scratch, tables)
    if surprise.shape[0] == n:  # no hold: each reading's surprise is its score
        surprise[:] = out
    return out


def score_learn(
    states: np.ndarray, stream: np.ndarray, values: np.ndarray, t_ms: np.ndarray, params: np.ndarray
) -> np.ndarray:
    """:func:`score_learn_into` without the surprises: the scores alone."""
    return score_learn_into(states, stream, values, t_ms, params, _NO_SURPRISE)


def py2_dict_order(keys: list[int]) -> list[int]:
    """The order CPython 2.7 iterates a dict of small non-negative int ``keys`` inserted in
    the given order (the order that numbers CAD OSE's new contexts)."""
    tables = np.empty((4, 16 * RIGHTS), dtype=np.int64)
    values = np.arange(len(keys), dtype=np.int64)
    size = _py2_table(np.asarray(keys, dtype=np.int64), values, len(keys), tables)
    return [int(k) for k in tables[0, :size] if k >= 0]


def py2_tuple_hash(items: list[int]) -> int:
    """CPython 2.7's ``hash(tuple(items))`` on a 64-bit build, for non-negative ints below 2**63."""
    hi, lo = _hash(np.asarray(items, dtype=np.float64), len(items))
    return (int(hi) << 32) | int(lo)


def given_range_scores(
    values: np.ndarray, low: float, high: float, params: np.ndarray, max_contexts: int | None
) -> tuple[np.ndarray, int]:
    """Scores of one stream whose value range is known beforehand (NAB's run: no readings
    spent on the range), and the contexts stored. ``max_contexts=None`` is the published
    algorithm's unbounded memory: the run repeats with twice the capacity while a run fills
    it, so no context is ever refused."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    zeros = np.zeros(len(values), dtype=np.int64)
    capacity = CONTEXTS if max_contexts is None else int(max_contexts)
    while True:
        p = params.copy()
        p[P_MAX_CONTEXTS] = capacity
        row = initial_state(p, capacity)
        row[STARTED], row[LOW], row[HIGH] = 1.0, low, high
        states = row.reshape(1, -1)
        scores = score_learn(states, zeros, values, zeros, p)
        stored = int(states[0, N_CONTEXTS])
        if max_contexts is not None or stored < capacity:
            return scores, stored
        capacity *= 2
