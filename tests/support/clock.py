"""Clocks a test moves: a service built with one acts on time the test sets, not time it
sleeps through."""

from __future__ import annotations

import time
from typing import Protocol

from tests.helpers import wait_for


class ShiftedClock:
    """The wall clock plus an offset the test advances: ``advance(6.5)`` is 6.5 s later for
    whoever reads this clock, at once."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s

    def advance(self, seconds: float) -> None:
        self.offset_s += seconds


class Rounds(Protocol):
    rounds: int


def next_rounds(service: Rounds, count: int = 2, timeout_s: float = 30.0) -> None:
    """Wait until ``service`` has done ``count`` more decision rounds: everything it had read
    and every time its clock showed before the call has been acted on (the first round may
    have started before)."""
    start = service.rounds
    wait_for(lambda: service.rounds >= start + count, timeout_s, f"{count} decision rounds")
