"""The peaks-over-threshold tail: clusters of exceedances count once."""

from __future__ import annotations

import random

from iotwatch.models.exceedance import ExceedanceTail


def _quiet(tail: ExceedanceTail, rng: random.Random, readings: int) -> None:
    for _ in range(readings):
        tail.learn(abs(rng.gauss(0, 1)))


def test_a_long_excursion_does_not_teach_the_tail_that_it_is_normal() -> None:
    rng = random.Random(3)
    declustered, every_exceedance = ExceedanceTail(), ExceedanceTail(run_gap=0)
    for tail in (declustered, every_exceedance):
        _quiet(tail, rng, 5_000)
    before = declustered.tail(20.0)
    for _ in range(50):  # a shifted level: 50 readings at 20 sigma
        declustered.learn(20.0)
        every_exceedance.learn(20.0)
    # About as rare as at its onset (one more cluster), while learning every exceedance made it ordinary.
    assert declustered.tail(20.0) < 1.5 * before < 1e-4
    assert every_exceedance.tail(20.0) > 100 * declustered.tail(20.0)


def test_repeated_excursions_are_learned_one_per_cluster() -> None:
    """A meter's kettle: a few readings high, several times a day -- it becomes normal."""
    rng = random.Random(4)
    tail = ExceedanceTail()
    _quiet(tail, rng, 2_000)
    first = tail.tail(15.0)
    for _ in range(40):
        for _ in range(6):
            tail.learn(15.0)
        _quiet(tail, rng, 200)
    assert tail.tail(15.0) > 100 * first
    assert tail.tail(15.0) > 1e-3  # about one kettle per 200 readings
