"""The seeded fault schedule: which component is hit how, and when (docs/operate/chaos.md, "Faults")."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Action(StrEnum):
    KILL = "kill -9"  # SIGKILL to the process group, started again after the hold
    INTERRUPT = "ctrl-c"  # SIGINT to the process group (a terminal's Ctrl-C), started again
    PAUSE = "pause"  # SIGSTOP for the hold, then SIGCONT: the network to it cut, connections kept


#: The stack's servers (the other targets are the run's component processes).
SERVICES = ("mqtt", "kafka", "influx")


@dataclass(frozen=True)
class FaultKind:
    target: str
    action: Action

    @property
    def name(self) -> str:
        return f"{self.target} {self.action.value}"


#: Every kind of fault a run injects.
FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind("gateway", Action.KILL),
    FaultKind("stream", Action.KILL),
    FaultKind("stream", Action.INTERRUPT),
    FaultKind("respond", Action.KILL),
    FaultKind("forward", Action.KILL),
    FaultKind("mqtt", Action.KILL),
    FaultKind("kafka", Action.KILL),
    FaultKind("influx", Action.KILL),
    FaultKind("mqtt", Action.PAUSE),
    FaultKind("kafka", Action.PAUSE),
)


@dataclass(frozen=True)
class PlannedFault:
    at_s: float  # seconds after the load started; a fault waits for the previous one's recovery
    kind: FaultKind
    hold_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"at_s": round(self.at_s, 1), "fault": self.kind.name, "hold_s": round(self.hold_s, 1)}


@dataclass(frozen=True)
class ScheduleOptions:
    duration_s: float
    seed: int = 1
    spacing_s: float = 45.0
    lead_s: float = 30.0  # load before the first fault (the job's first batches, the detectors' warm-up)
    tail_s: float = 15.0  # load after the last planned fault
    kill_hold_s: float = 5.0
    pause_hold_s: float = 10.0
    kinds: tuple[FaultKind, ...] = FAULT_KINDS  # a subset repeats one fault (e.g. to chase one failure)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kinds": [kind.name for kind in self.kinds]}


def fault_kind(name: str) -> FaultKind:
    """The fault kind called ``name`` (e.g. ``"kafka pause"``)."""
    for kind in FAULT_KINDS:
        if kind.name == name:
            return kind
    raise ValueError(f"no fault kind {name!r}; known: {', '.join(k.name for k in FAULT_KINDS)}")


def plan(options: ScheduleOptions) -> list[PlannedFault]:
    """The faults of one run in time order: whole seeded permutations of the options' kinds
    (at least one), as many as fit at ``spacing_s`` between ``lead_s`` and ``duration_s - tail_s``."""
    kinds = options.kinds
    if not kinds:
        return []
    rng = random.Random(options.seed)
    window = max(0.0, options.duration_s - options.lead_s - options.tail_s)
    cycles = max(1, int(window // (options.spacing_s * len(kinds))))
    order: list[FaultKind] = []
    for _ in range(cycles):
        order += rng.sample(kinds, len(kinds))
    slot = window / len(order)
    faults = []
    for i, kind in enumerate(order):
        at = options.lead_s + slot * (i + rng.uniform(0.1, 0.6))
        base = options.pause_hold_s if kind.action is Action.PAUSE else options.kill_hold_s
        faults.append(PlannedFault(at, kind, base * rng.uniform(0.5, 1.5)))
    return faults
