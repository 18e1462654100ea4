"""The Contextual Anomaly Detector, open-source edition (CAD OSE), as NAB publishes it.

CAD OSE (M. Smirnov, NAB v1.1 entry ``contextOSE``, 69.9 on the whole corpus, standard
profile) reads a stream as a sequence of *facts*: each reading is cut into
``value_bits`` bits over a fixed value range, each bit a fact. A *context* pairs a left
semi-context (facts of the previous step: its bits and the contexts fully active then, as
"neurons") with a right semi-context (facts of the step after). Each step updates the
contexts whose left side the previous step held and scores the reading by the share of
them whose right side did not come true and the share of candidate contexts it had to
learn. After a score of ``base_threshold`` or more it keeps quiet for ``rest_period``
readings.

The reproduction is exact (``tests/models/test_cad_ose.py`` holds it to the published
per-row scores as NAB rounds them): it follows the published order of every step,
including the two places where the original's output depends on its Python 2 runtime --
the hash of a tuple of facts (it breaks ties between active contexts) and the iteration
order of a small dict of integers (it numbers new contexts) -- both computed here as
CPython 2.7 on 64 bits computes them (:func:`py2_tuple_hash`, :class:`Py2IntKeyOrder`).

Memory grows with the contexts learned; ``max_contexts`` caps it (no new context is
stored once that many exist; ``None``: no cap, the published algorithm).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "ContextOperator",
    "ContextualAnomalyCore",
    "Py2IntKeyOrder",
    "nab_scores",
    "py2_tuple_hash",
]

_MASK64 = (1 << 64) - 1
#: Sensor facts are ``2 * bit + value``; neuron facts ``NEURON_BASE + context``.
NEURON_BASE = 2**31


def _signed64(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


def py2_tuple_hash(items: Sequence[int]) -> int:
    """CPython 2.7's ``hash(tuple(items))`` on a 64-bit build, for non-negative ints below
    2**63 (an int hashes to itself there): the original breaks ties between active
    contexts by these hashes.

    >>> py2_tuple_hash(())
    3527539
    """
    x = 0x345678
    mult = 1000003
    n = len(items)
    for item in items:
        n -= 1
        x = _signed64((x ^ item) * mult)
        mult = _signed64(mult + 82520 + n + n)
    x = _signed64(x + 97531)
    return -2 if x == -1 else x


class Py2IntKeyOrder:
    """The iteration order of a CPython 2.7 dict whose keys are small non-negative ints
    inserted in a given order and never deleted: open addressing over a power-of-two table
    (``i = 5 i + perturb + 1``, ``perturb >>= 5``), grown to the smallest power of two
    above four times the keys once two thirds are filled.

    >>> order = Py2IntKeyOrder()
    >>> for k in (9, 1, 17): order.add(k)
    >>> list(order)
    [17, 1, 9]
    """

    __slots__ = ("table",)

    def __init__(self) -> None:
        self.table: list[int | None] = [None] * 8

    @staticmethod
    def _slot(table: list[int | None], key: int) -> int:
        mask = len(table) - 1
        i = key & mask
        perturb = key
        while table[i & mask] is not None:
            i = (i << 2) + i + perturb + 1
            perturb >>= 5
        return i & mask

    def add(self, key: int) -> None:
        """Insert a key that is not present yet."""
        table = self.table
        table[self._slot(table, key)] = key
        used = sum(1 for k in table if k is not None)
        if used * 3 >= len(table) * 2:
            size = 8
            while size <= 4 * used:
                size <<= 1
            grown: list[int | None] = [None] * size
            for k in table:
                if k is not None:
                    grown[self._slot(grown, k)] = k
            self.table = grown

    def __iter__(self):
        return (k for k in self.table if k is not None)

    def __len__(self) -> int:
        return sum(1 for k in self.table if k is not None)


class _Semi:
    """A semi-context: its facts' count, the facts of it seen at the last crossing and, for
    a left one, the contexts it begins (right semi-context id -> context id, in dict order)."""

    __slots__ = ("size", "crossed", "n_crossed", "contexts", "order")

    def __init__(self, size: int, left: bool) -> None:
        self.size = size
        self.crossed: list[int] = []
        self.n_crossed = 0
        self.contexts: dict[int, int] = {}
        self.order = Py2IntKeyOrder() if left else None


class _Context:
    """A context's counters: weight of its selections, weight of its hits, times fully
    active; its right facts; whether it was ever a zero-level context; its sides' hashes."""

    __slots__ = ("selected", "hits", "active", "right_facts", "zero_level", "left_hash", "right_hash")

    def __init__(self, right_facts: tuple[int, ...], zero_level: bool, left_hash: int, right_hash: int) -> None:
        self.selected = 0
        self.hits = 0
        self.active = 0
        self.right_facts = right_facts
        self.zero_level = zero_level
        self.left_hash = left_hash
        self.right_hash = right_hash


class ContextOperator:
    """The context memory: semi-contexts by side, the contexts joining them, and the
    crossing of a step's facts with them."""

    def __init__(self, max_left_length: int = 7, max_contexts: int | None = None) -> None:
        self.max_left_length = max_left_length
        self.max_contexts = max_contexts
        self.facts: tuple[dict[int, list[_Semi]], dict[int, list[_Semi]]] = ({}, {})
        self.semi_ids: tuple[dict[int, int], dict[int, int]] = ({}, {})
        self.semis: tuple[list[_Semi], list[_Semi]] = ([], [])
        self.crossed: list[list[_Semi]] = [[], []]
        self.contexts: list[_Context] = []
        #: The zero-level context created this step (0 when none: context 0 is then skipped,
        #: as the original's ``False != 0`` is false).
        self.new_context = 0

    def _semi(self, side: int, facts: tuple[int, ...], key: int) -> int:
        ids = self.semi_ids[side]
        found = ids.get(key)
        if found is not None:
            return found
        ident = ids[key] = len(self.semis[side])
        semi = _Semi(len(facts), left=side == 0)
        self.semis[side].append(semi)
        for fact in facts:
            self.facts[side].setdefault(fact, []).append(semi)
        return ident

    def add_contexts(self, candidates: Iterable[tuple[tuple[int, ...], tuple[int, ...]]]) -> int:
        """Store each ``(left facts, right facts)`` not known yet; the number stored."""
        added = 0
        for left, right in candidates:
            if self.max_contexts is not None and len(self.contexts) >= self.max_contexts:
                break
            left_hash, right_hash = py2_tuple_hash(left), py2_tuple_hash(right)
            left_id = self._semi(0, left, left_hash)
            right_id = self._semi(1, right, right_hash)
            semi = self.semis[0][left_id]
            if right_id not in semi.contexts:
                semi.contexts[right_id] = len(self.contexts)
                semi.order.add(right_id)
                self.contexts.append(_Context(right, False, left_hash, right_hash))
                added += 1
        return added

    def add_zero_level(self, left: tuple[int, ...], right: tuple[int, ...]) -> bool:
        """Store the context of the previous step's facts followed by this step's; True when
        it is new (and then it is this step's new context)."""
        left_hash, right_hash = py2_tuple_hash(left), py2_tuple_hash(right)
        if self.max_contexts is not None and len(self.contexts) >= self.max_contexts:
            semi = self.semis[0][self.semi_ids[0][left_hash]] if left_hash in self.semi_ids[0] else None
            right_id = self.semi_ids[1].get(right_hash)
            if semi is not None and right_id is not None and right_id in semi.contexts:
                self.contexts[semi.contexts[right_id]].zero_level = True
            return False
        left_id = self._semi(0, left, left_hash)
        right_id = self._semi(1, right, right_hash)
        semi = self.semis[0][left_id]
        if right_id in semi.contexts:
            self.contexts[semi.contexts[right_id]].zero_level = True
            return False
        ident = semi.contexts[right_id] = len(self.contexts)
        semi.order.add(right_id)
        self.contexts.append(_Context(right, True, left_hash, right_hash))
        self.new_context = ident
        return True

    def _cross(self, side: int, facts: Sequence[int]) -> list[_Semi]:
        """Mark on each semi-context of ``side`` which of ``facts`` it holds; those holding any."""
        for semi in self.crossed[side]:
            semi.crossed = []
            semi.n_crossed = 0
        index = self.facts[side]
        for fact in facts:
            for semi in index.get(fact, ()):
                semi.crossed.append(fact)
        crossed = []
        for semi in self.semis[side]:
            semi.n_crossed = len(semi.crossed)
            if semi.n_crossed:
                crossed.append(semi)
        self.crossed[side] = crossed
        return crossed

    def cross_right(
        self, facts: Sequence[int], new_context: bool
    ) -> tuple[list[tuple[int, int, int, int]], int, list[tuple[tuple[int, ...], tuple[int, ...]]]]:
        """Cross this step's facts with the right semi-contexts, then update every context
        whose left side the previous step fully held: ``(active contexts as (id, times
        active, left hash, right hash), contexts selected, candidate new contexts)``."""
        self._cross(1, facts)
        active: list[tuple[int, int, int, int]] = []
        selected = 0
        candidates: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        rights = self.semis[1]
        for left in self.crossed[0]:
            full = left.size == left.n_crossed
            short = left.n_crossed <= self.max_left_length
            for right_id in left.order:
                ident = left.contexts[right_id]
                if ident == self.new_context:
                    continue
                context = self.contexts[ident]
                right = rights[right_id]
                if full:
                    selected += 1
                    context.selected += right.size
                    if right.n_crossed > 0:
                        context.hits += right.n_crossed
                        if right.size == right.n_crossed:
                            context.active += 1
                            active.append((ident, context.active, context.left_hash, context.right_hash))
                        elif context.zero_level and new_context and short:
                            candidates.append((tuple(left.crossed), tuple(right.crossed)))
                elif context.zero_level and new_context and right.n_crossed > 0 and short:
                    candidates.append((tuple(left.crossed), tuple(right.crossed)))
        self.new_context = 0
        return active, selected, candidates

    def cross_left(self, facts: Sequence[int], candidates: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> int:
        """Store the candidate contexts, then cross this step's left facts with the left
        semi-contexts (the next step updates the contexts they begin): contexts stored."""
        added = self.add_contexts(candidates) if candidates else 0
        self._cross(0, facts)
        return added


class ContextualAnomalyCore:
    """CAD OSE over a known value range: :meth:`score_learn` one value at a time.

    ``min_value``/``max_value`` set the range cut into ``2**value_bits - 1`` steps (NAB
    passes the stream's own minimum and maximum); ``rest_period`` readings of silence
    follow a score of ``base_threshold`` or more (NAB: 3 % of the stream's length).
    """

    def __init__(
        self,
        min_value: float,
        max_value: float,
        rest_period: float = 30,
        base_threshold: float = 0.75,
        max_left_length: int = 7,
        max_active_neurons: int = 15,
        value_bits: int = 3,
        max_contexts: int | None = None,
    ) -> None:
        self.min_value = float(min_value)
        self.max_value = float(max_value)
        self.rest_period = rest_period
        self.base_threshold = base_threshold
        self.max_active_neurons = max_active_neurons
        self.value_bits = value_bits
        self.max_bin = 2**value_bits - 1.0
        span = self.max_value - self.min_value
        self.step_width = (span if span != 0.0 else self.max_bin) / self.max_bin
        self.memory = ContextOperator(max_left_length, max_contexts)
        self.left_facts: tuple[int, ...] = ()
        rest = int(rest_period)
        #: The last ``rest`` raw scores (a 1.0 before the first reading, as published).
        self.history: deque[float] = deque([1.0], maxlen=rest if rest > 0 else None)

    def facts(self, value: float) -> tuple[int, ...]:
        """The sensor facts of a value: one per bit of its step number, low bit first."""
        level = int((value - self.min_value) / self.step_width)
        bits = max(self.value_bits, level.bit_length()) if level >= 0 else self.value_bits
        return tuple(2 * k + ((level >> k) & 1 if level >= 0 else 0) for k in range(bits))

    def _step(self, sensed: tuple[int, ...]) -> tuple[float, float]:
        """Learn one step's facts: the share of selected contexts that came true and the
        share of candidate contexts that were new."""
        memory = self.memory
        candidates_seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
        if self.left_facts and sensed:
            candidates_seen.add((self.left_facts, sensed))
            new_context = memory.add_zero_level(self.left_facts, sensed)
        else:
            new_context = False
        active, selected, candidates = memory.cross_right(sensed, new_context)
        candidates_seen.update(candidates)
        active_share = len(active) / float(selected) if selected > 0 else 0.0
        active.sort(key=lambda a: (a[1], a[2], a[3]))
        neurons = {NEURON_BASE + a[0] for a in active[-self.max_active_neurons :]} if active else set()
        self.left_facts = tuple(sorted(set(sensed) | neurons))
        added = memory.cross_left(self.left_facts, candidates)
        added += 1 if new_context else 0
        new_share = added / float(len(candidates_seen)) if new_context and candidates_seen else 0.0
        return active_share, new_share

    def score_learn(self, value: float) -> float:
        """The published score of ``value``, then learn it."""
        active_share, new_share = self._step(self.facts(value))
        raw = (1.0 - active_share + new_share) / 2.0
        out = raw if max(self.history) < self.base_threshold else 0.0
        self.history.append(raw)
        return out

    def contexts(self) -> int:
        """Contexts stored."""
        return len(self.memory.contexts)


def nab_scores(values: Sequence[float] | np.ndarray, probationary_percent: float = 0.15, **params: Any) -> np.ndarray:
    """CAD OSE run as NAB runs it on one stream: the range is the stream's own minimum and
    maximum and the rest period a fifth of the probationary ``floor(0.15 n)`` readings."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    core = ContextualAnomalyCore(
        min_value=float(values.min()),
        max_value=float(values.max()),
        rest_period=min(math.floor(probationary_percent * n), probationary_percent * 5000) / 5.0,
        **params,
    )
    return np.array([core.score_learn(v) for v in values.tolist()])
