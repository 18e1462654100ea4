"""When a group of alerts is notified, and with what: Alertmanager's and Grafana's policy as a
pure function of the group's alerts, its last notification and the time.

:class:`iotwatch.alerts.dispatch.Dispatcher` gathers the inputs (which alerts fire, unsilenced; which the
receiver was last told of; which cleared) and sends what this decides, so the policy is tested
with a clock that is just a number.
"""

from __future__ import annotations

from dataclasses import dataclass

from iotwatch.alerts.routing import Route
from iotwatch.contract.oncall import NotificationKind


@dataclass(frozen=True)
class GroupNow:
    """A group as it stands at ``now_ms``: what fires (unsilenced, sorted), what the receiver
    was last told fired and when, which of those cleared since, and which firing alerts are
    critical and unacknowledged."""

    firing: list[str]
    notified: frozenset[str]
    last_sent_ms: int | None  # None: never notified, or last told that nothing fired
    resolved: list[str]
    unacked_critical: list[str]
    pending_since_ms: int | None  # first change not yet notified (group_wait runs from here)
    now_ms: int


@dataclass(frozen=True)
class Due:
    """A notification to send now."""

    kind: NotificationKind
    firing: list[str]
    resolved: list[str]
    repeated: list[str]


def decide(group: GroupNow, route: Route) -> tuple[Due | None, int | None]:
    """The notification due now, if any, and the group's pending-since time afterwards.

    - new firing alerts or resolutions in a group that has nothing firing notified wait
      ``group_wait`` from the first of them (a burst becomes one notification);
    - in a group already notified, changes are sent at most once per ``group_interval``;
    - with nothing new, unacknowledged critical alerts still firing are sent again after
      ``repeat_interval``.

    >>> route = Route("0", "oncall", ("site",), group_wait_s=30.0, group_interval_s=300.0, repeat_interval_s=3600.0)
    >>> g = GroupNow(["a1"], frozenset(), None, [], [], None, now_ms=0)
    >>> decide(g, route)
    (None, 0)
    >>> decide(GroupNow(["a1", "a2"], frozenset(), None, [], [], 0, now_ms=30_000), route)[0].firing
    ['a1', 'a2']
    """
    new = [a for a in group.firing if a not in group.notified]
    now = group.now_ms
    if new or group.resolved:
        pending = group.pending_since_ms
        if group.last_sent_ms is None:
            pending = pending if pending is not None else now
            if now - pending < route.group_wait_s * 1000:
                return None, pending
        elif now - group.last_sent_ms < route.group_interval_s * 1000:
            return None, pending
        kind = NotificationKind.FIRING if new else NotificationKind.RESOLVED
        # pending until the notification is delivered (a failed post keeps the group waiting)
        return Due(kind, group.firing, group.resolved, []), pending
    if group.last_sent_ms is None or not group.firing:
        return None, None
    if group.unacked_critical and now - group.last_sent_ms >= route.repeat_interval_s * 1000:
        return Due(NotificationKind.REPEAT, group.firing, [], group.unacked_critical), None
    return None, None
