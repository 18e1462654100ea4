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

The reproduction is exact (``tests/unit/evaluation/test_cad_ose.py`` holds it to the published
per-row scores as NAB rounds them): it follows the published order of every step,
including the two places where the original's output depends on its Python 2 runtime --
the hash of a tuple of facts (it breaks ties between active contexts) and the iteration
order of a small dict of integers (it numbers new contexts) -- both computed here as
CPython 2.7 on 64 bits computes them (:func:`py2_tuple_hash`, :class:`Py2IntKeyOrder`).

Memory grows with the contexts learned; ``max_contexts`` caps it (no new context is
stored once that many exist; ``None``: no cap, the published algorithm).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Self

import numpy as np

from iotwatch.contract.detection import AnomalyKind
from iotwatch.models.base import Detector, Reading, UnivariateMixin

__all__ = [
    "CadOse",
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
    [9, 17, 1]
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
    """A semi-context: its facts and their count, the facts of it seen at the last crossing and, for
    a left one, the contexts it begins (right semi-context id -> context id, in dict order)."""

    __slots__ = ("facts", "size", "crossed", "n_crossed", "contexts", "order")

    def __init__(self, facts: tuple[int, ...], left: bool) -> None:
        self.facts = facts
        self.size = len(facts)
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
        semi = _Semi(facts, left=side == 0)
        self.semis[side].append(semi)
        for fact in facts:
            self.facts[side].setdefault(fact, []).append(semi)
        return ident

    def full(self) -> bool:
        """True when ``max_contexts`` contexts are stored (no more are)."""
        return self.max_contexts is not None and len(self.contexts) >= self.max_contexts

    def _find(self, left_hash: int, right_hash: int) -> int | None:
        """The stored context with sides of these hashes (None: unknown)."""
        left_id, right_id = self.semi_ids[0].get(left_hash), self.semi_ids[1].get(right_hash)
        if left_id is None or right_id is None:
            return None
        return self.semis[0][left_id].contexts.get(right_id)

    def _store(
        self, left: tuple[int, ...], right: tuple[int, ...], left_hash: int, right_hash: int, zero_level: bool
    ) -> int | None:
        """Store an unknown context: its id (None: the memory is full)."""
        if self.full():
            return None
        semi = self.semis[0][self._semi(0, left, left_hash)]
        right_id = self._semi(1, right, right_hash)
        ident = semi.contexts[right_id] = len(self.contexts)
        semi.order.add(right_id)
        self.contexts.append(_Context(right, zero_level, left_hash, right_hash))
        return ident

    def add_contexts(self, candidates: Iterable[tuple[tuple[int, ...], tuple[int, ...]]]) -> int:
        """Store each ``(left facts, right facts)`` not known yet, while there is room: the
        number of distinct unknown ones (stored or not: a full memory still sees novelty)."""
        unknown = 0
        unstored: set[tuple[int, int]] = set()
        for left, right in candidates:
            key = py2_tuple_hash(left), py2_tuple_hash(right)
            if self._find(*key) is None and key not in unstored:
                unknown += 1
                if self._store(left, right, *key, zero_level=False) is None:
                    unstored.add(key)
        return unknown

    def add_zero_level(self, left: tuple[int, ...], right: tuple[int, ...]) -> bool:
        """Store the context of the previous step's facts followed by this step's; True when
        it is unknown (stored, it is this step's new context)."""
        key = py2_tuple_hash(left), py2_tuple_hash(right)
        ident = self._find(*key)
        if ident is not None:
            self.contexts[ident].zero_level = True
            return False
        stored = self._store(left, right, *key, zero_level=True)
        self.new_context = -1 if stored is None else stored
        return True

    def restore(
        self,
        left: list[tuple[int, ...]],
        right: list[tuple[int, ...]],
        contexts: list[list[int]],
        left_facts: tuple[int, ...],
    ) -> None:
        """Rebuild the memory from its semi-contexts' facts and its contexts (``[left id,
        right id, selected, hits, active, zero level]`` in id order), crossed with the last
        step's left facts as that step left it."""
        for facts in left:
            self._semi(0, facts, py2_tuple_hash(facts))
        for facts in right:
            self._semi(1, facts, py2_tuple_hash(facts))
        for left_id, right_id, selected, hits, active, zero_level in contexts:
            semi = self.semis[0][left_id]
            right_facts = self.semis[1][right_id].facts
            semi.contexts[right_id] = len(self.contexts)
            semi.order.add(right_id)
            context = _Context(right_facts, bool(zero_level), py2_tuple_hash(semi.facts), py2_tuple_hash(right_facts))
            context.selected, context.hits, context.active = selected, hits, active
            self.contexts.append(context)
        self._cross(0, left_facts)

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
        #: Raw scores since the last one of ``base_threshold`` or more (the published history
        #: begins with a 1.0, so the first ``rest_period`` readings score 0).
        self.since = 0

    def facts(self, value: float) -> tuple[int, ...]:
        """The sensor facts of a value: one per bit of its step number (``2 * bit + value``),
        low bit first; a value beyond the range takes the outermost step."""
        level = int(min(max((value - self.min_value) / self.step_width, 0.0), self.max_bin))
        return tuple(2 * k + ((level >> k) & 1) for k in range(self.value_bits))

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
        rest = int(self.rest_period)
        out = raw if 0 < rest <= self.since else 0.0
        self.since = 0 if raw >= self.base_threshold else self.since + 1
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


class CadOse(UnivariateMixin, Detector):
    """CAD OSE on a stream: the published algorithm over a value range set by the stream's
    first readings, its context memory capped.

    NAB hands CAD OSE each stream's minimum and maximum beforehand and a rest period of a
    fifth of the stream's probationary readings; a stream has neither, so here the range is
    the first ``range_readings`` readings' minimum and maximum widened by ``margin`` of
    their span each side (values beyond it take the outermost level; no score until it is
    set), and ``rest_period`` is fixed (150 is NAB's on a stream of 5,000 readings or more).
    ``max_contexts`` bounds the state (:class:`ContextOperator`); the kernel
    (:mod:`iotwatch.models.kernels.cad_ose`) holds it in a fixed row.
    """

    name: ClassVar[str] = "cad_ose"
    #: None claimed: on the generated test streams (``tests/support/streams.py``) its clean
    #: scores reach those of the anomalies; it is measured on NAB instead.
    detects: ClassVar[frozenset[AnomalyKind]] = frozenset()

    def __init__(
        self,
        metric: str | None = None,
        range_readings: int = 150,
        margin: float = 0.0,
        rest_period: int = 150,
        base_threshold: float = 0.75,
        max_left_length: int = 7,
        max_active_neurons: int = 15,
        value_bits: int = 3,
        max_contexts: int = 1024,
    ) -> None:
        self.metric = metric
        self.range_readings = range_readings
        self.margin = margin
        self.rest_period = rest_period
        self.base_threshold = base_threshold
        self.max_left_length = max_left_length
        self.max_active_neurons = max_active_neurons
        self.value_bits = value_bits
        self.max_contexts = max_contexts
        self.n = 0
        self.low, self.high = math.inf, -math.inf
        self.core: ContextualAnomalyCore | None = None

    def warmup_readings(self) -> int:
        return self.range_readings + self.rest_period

    def state_limit_bytes(self) -> int:
        """Per context six counts, per semi-context (at most one a context) up to
        ``value_bits + max_active_neurons`` facts, each at most 21 characters with its comma."""
        return 512 + 21 * self.max_contexts * (6 + self.value_bits + self.max_active_neurons + 2 * self.value_bits)

    def _start(self) -> None:
        span = self.high - self.low
        self.core = ContextualAnomalyCore(
            self.low - self.margin * span,
            self.high + self.margin * span,
            rest_period=self.rest_period,
            base_threshold=self.base_threshold,
            max_left_length=self.max_left_length,
            max_active_neurons=self.max_active_neurons,
            value_bits=self.value_bits,
            max_contexts=self.max_contexts,
        )

    def score_one(self, x: Reading, t_ms: int) -> float:
        """The score :meth:`score_learn_one` would give (CAD OSE scores by learning: this
        learns on a copy, so it is slow; the streaming step is :meth:`score_learn_one`)."""
        return copy.deepcopy(self).score_learn_one(x, t_ms)

    def learn_one(self, x: Reading, t_ms: int) -> None:
        self.score_learn_one(x, t_ms)

    def score_learn_one(self, x: Reading, t_ms: int) -> float:
        v = self._value(x)
        if v is None:
            return 0.0
        self.n += 1
        if self.core is None:
            self.low, self.high = min(self.low, v), max(self.high, v)
            if self.n >= self.range_readings:
                self._start()
            return 0.0
        return self.core.score_learn(v)

    # --- state --------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Readings seen, the range, and once it is set the context memory: each context as
        ``[left id, right id, selected, hits, active, zero level]``, each semi-context's
        facts, the last step's left facts and the readings since the last high score."""
        state: dict[str, Any] = {"n": self.n, "low": self.low, "high": self.high}
        core = self.core
        if core is not None:
            memory = core.memory
            left_of = {
                ident: (lid, rid) for lid, semi in enumerate(memory.semis[0]) for rid, ident in semi.contexts.items()
            }
            state["since"] = core.since
            state["left_facts"] = list(core.left_facts)
            state["left"] = [list(semi.facts) for semi in memory.semis[0]]
            state["right"] = [list(semi.facts) for semi in memory.semis[1]]
            state["contexts"] = [
                [*left_of[k], c.selected, c.hits, c.active, int(c.zero_level)] for k, c in enumerate(memory.contexts)
            ]
        return state

    def set_state(self, state: Mapping[str, Any]) -> Self:
        self.n = int(state["n"])
        self.low, self.high = float(state["low"]), float(state["high"])
        self.core = None
        if "contexts" in state:
            self._start()
            core = self.core
            assert core is not None
            core.since = int(state["since"])
            core.left_facts = tuple(int(f) for f in state["left_facts"])
            core.memory.restore(
                [tuple(int(f) for f in facts) for facts in state["left"]],
                [tuple(int(f) for f in facts) for facts in state["right"]],
                [[int(x) for x in c] for c in state["contexts"]],
                core.left_facts,
            )
        return self
