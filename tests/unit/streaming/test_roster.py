"""The partition roster: a device is silent when its peers kept arriving without it; an
outage of the whole input, or a clean goodbye, holds its timer."""

from __future__ import annotations

import numpy as np

from iotwatch.streaming.roster import OFFLINE, Roster

T0 = 1_763_784_000_000
TIMEOUT = 60_000


def roster_heard(names: list[str], second: int, roster: Roster | None = None) -> Roster:
    """``names`` heard at ``second`` (wall, append and event time alike)."""
    roster = roster or Roster.load(None)
    at = T0 + second * 1000
    roster.heard(names, at, np.full(len(names), at), np.full(len(names), at))
    return roster


def test_a_device_that_stops_while_its_peers_report_is_due_once() -> None:
    roster = roster_heard(["a", "b", "c"], 0)
    for second in range(1, 90):
        roster_heard(["a", "b"], second, roster)
    assert roster.due(T0 + 89_000, TIMEOUT) == ["c"]
    assert roster.due(T0 + 89_000, TIMEOUT) == []  # reported once
    roster_heard(["c"], 90, roster)
    assert roster.reporting() == 3


def test_an_outage_of_the_whole_input_holds_every_timer_and_its_backlog_releases_them() -> None:
    roster = roster_heard(["a", "b", "c"], 0)
    now = T0 + 180_000  # nothing arrived for three minutes of wall time
    assert roster.due(now, TIMEOUT) == [] and roster.held(now, TIMEOUT) == 3
    assert roster.next_due_ms(TIMEOUT, now) == 0  # only records can move the clocks on
    # the backlog: appended after the outage, with the event times of the outage
    at = np.full(2, now)
    roster.heard(["a", "b"], now, at, np.full(2, T0 + 30_000))
    assert roster.due(now, TIMEOUT) == []  # c may be further down the backlog
    roster.heard(["a", "b"], now + 1000, at + 1000, np.full(2, T0 + 95_000))
    assert roster.due(now + 1000, TIMEOUT) == ["c"]  # its peers reported 95 s of events without it


def test_a_device_whose_clock_runs_ahead_does_not_move_the_partition_clock() -> None:
    roster = roster_heard(["a", "b"], 0)
    roster.heard(["a"], T0 + 61_000, np.asarray([T0 + 61_000]), np.asarray([T0 + 10**9]))
    assert roster.event_ms == T0 + 61_000


def test_a_clean_goodbye_is_never_silence_until_heard_again() -> None:
    roster = roster_heard(["a", "b"], 0)
    roster.said_goodbye(["b"])
    for second in range(1, 90):
        roster_heard(["a"], second, roster)
    assert roster.due(T0 + 89_000, TIMEOUT) == [] and roster.offline() == ["b"]
    roster_heard(["b"], 90, roster)
    assert roster.offline() == [] and int(roster.state[1]) != OFFLINE


def test_the_stored_value_round_trips() -> None:
    roster = roster_heard(["a", "b"], 5)
    roster.said_goodbye(["a"])
    again = Roster.load(roster.to_value())
    assert again.devices == ["a", "b"] and again.offline() == ["a"]
    assert (again.heard_ms == roster.heard_ms).all() and (again.log_ms, again.event_ms) == (
        roster.log_ms,
        roster.event_ms,
    )
