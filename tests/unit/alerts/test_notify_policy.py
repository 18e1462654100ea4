"""The notification policy on a clock that is a number: group_wait, group_interval, resolved
notifications and repeats of unacknowledged critical alerts, without sleeping."""

from __future__ import annotations

from dataclasses import replace

from iotwatch.alerts.notify_policy import Due, GroupNow, decide
from iotwatch.alerts.routing import Route
from iotwatch.contract.oncall import NotificationKind

ROUTE = Route("0", "oncall", ("site", "rule"), group_wait_s=30.0, group_interval_s=300.0, repeat_interval_s=3600.0)


def group(now_ms: int, firing: list[str], **fields: object) -> GroupNow:
    """A group at ``now_ms`` with ``firing`` alerts, never notified unless ``fields`` say so."""
    return replace(GroupNow(firing, frozenset(), None, [], [], None, now_ms), **fields)


def test_a_burst_waits_group_wait_from_its_first_alert_and_goes_out_as_one() -> None:
    due, pending = decide(group(1_000, ["a"]), ROUTE)
    assert due is None and pending == 1_000
    due, pending = decide(group(20_000, ["a", "b"], pending_since_ms=pending), ROUTE)
    assert due is None and pending == 1_000  # the wait runs from the first alert, not the last
    due, pending = decide(group(31_000, ["a", "b", "c"], pending_since_ms=pending), ROUTE)
    assert due == Due(NotificationKind.FIRING, ["a", "b", "c"], [], [])
    assert pending == 1_000  # kept until the post is delivered


def test_changes_to_a_notified_group_wait_for_group_interval() -> None:
    notified = {"notified": frozenset({"a"}), "last_sent_ms": 0}
    assert decide(group(299_999, ["a", "b"], **notified), ROUTE)[0] is None
    due, _ = decide(group(300_000, ["a", "b"], **notified), ROUTE)
    assert due is not None and due.kind is NotificationKind.FIRING and due.firing == ["a", "b"]


def test_a_cleared_alert_is_sent_as_resolved_once_the_interval_allows() -> None:
    state = {"notified": frozenset({"a", "b"}), "last_sent_ms": 0, "resolved": ["b"]}
    assert decide(group(100_000, ["a"], **state), ROUTE)[0] is None
    due, _ = decide(group(300_000, ["a"], **state), ROUTE)
    assert due == Due(NotificationKind.RESOLVED, ["a"], ["b"], [])


def test_only_unacknowledged_critical_alerts_repeat_after_repeat_interval() -> None:
    state = {"notified": frozenset({"a", "b"}), "last_sent_ms": 0}
    assert decide(group(3_599_999, ["a", "b"], unacked_critical=["a"], **state), ROUTE) == (None, None)
    due, pending = decide(group(3_600_000, ["a", "b"], unacked_critical=["a"], **state), ROUTE)
    assert due == Due(NotificationKind.REPEAT, ["a", "b"], [], ["a"]) and pending is None
    # acknowledged (or not critical): never repeated, however long it fires
    assert decide(group(10 * 3_600_000, ["a", "b"], **state), ROUTE) == (None, None)


def test_a_group_that_went_quiet_starts_afresh_with_group_wait() -> None:
    # last told: nothing fires (all resolved); a new alert waits group_wait, not group_interval
    due, pending = decide(group(10_000, ["c"], last_sent_ms=None), ROUTE)
    assert due is None and pending == 10_000
    due, _ = decide(group(40_000, ["c"], pending_since_ms=pending), ROUTE)
    assert due is not None and due.firing == ["c"]


def test_nothing_firing_and_nothing_new_sends_nothing() -> None:
    assert decide(group(0, []), ROUTE) == (None, None)
    assert decide(group(10**9, [], notified=frozenset(), last_sent_ms=0), ROUTE) == (None, None)
