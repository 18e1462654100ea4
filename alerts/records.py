"""Reading, filtering and describing alert records (the format of :mod:`streaming.alerting`).

Both tools decode the same way so that ``tail`` shows exactly what ``forward`` would send.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

SEVERITIES = ("critical", "major", "minor", "warning")  # most to least severe
STATES = ("raised", "cleared")
#: Slack emoji per severity; a cleared alert is green whatever its severity.
EMOJI = {
    "critical": ":red_circle:",
    "major": ":large_orange_circle:",
    "minor": ":large_yellow_circle:",
    "warning": ":large_blue_circle:",
}
CLEARED_EMOJI = ":large_green_circle:"


class BadAlert(ValueError):
    """A record on the alert topic that is not an alert (kept apart so it can be dead-lettered)."""


def decode(value: bytes | None) -> dict[str, Any]:
    """The alert of one Kafka value; :class:`BadAlert` when it is not JSON or lacks the identity fields."""
    if value is None:
        raise BadAlert("empty value")
    try:
        alert = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadAlert(f"not JSON: {exc}") from exc
    if not isinstance(alert, dict):
        raise BadAlert("not a JSON object")
    for name in ("alert_id", "state"):
        if not isinstance(alert.get(name), str) or not alert[name]:
            raise BadAlert(f"missing field {name}")
    return alert


def severity_rank(severity: Any) -> int:
    """0 for critical ... 3 for warning; unknown severities rank below warning."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


@dataclass(frozen=True)
class AlertFilter:
    """What ``tail`` shows: a minimum severity and allow-lists (empty = any)."""

    min_severity: str | None = None
    sites: frozenset[str] = frozenset()
    device_types: frozenset[str] = frozenset()
    rules: frozenset[str] = frozenset()
    devices: frozenset[str] = frozenset()
    states: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls,
        min_severity: str | None = None,
        sites: Iterable[str] = (),
        device_types: Iterable[str] = (),
        rules: Iterable[str] = (),
        devices: Iterable[str] = (),
        states: Iterable[str] = (),
    ) -> AlertFilter:
        return cls(
            min_severity,
            frozenset(sites),
            frozenset(device_types),
            frozenset(rules),
            frozenset(devices),
            frozenset(states),
        )

    def matches(self, alert: dict[str, Any]) -> bool:
        if self.min_severity and severity_rank(alert.get("severity")) > severity_rank(self.min_severity):
            return False
        for allowed, name in (
            (self.sites, "site"),
            (self.device_types, "device_type"),
            (self.rules, "rule"),
            (self.devices, "device_id"),
            (self.states, "state"),
        ):
            if allowed and alert.get(name) not in allowed:
                return False
        return True


def headline(alert: dict[str, Any]) -> str:
    """The one-line description: the record's own ``message``, or one built like it."""
    if alert.get("message"):
        return str(alert["message"])
    where = f"{alert.get('device_type', '?')} {alert.get('device_id', '?')} at {alert.get('site', '?')}"
    return f"[{str(alert.get('severity', '?')).upper()}] {alert.get('rule', '?')} {alert.get('state')} on {where}"


def slack_text(alert: dict[str, Any]) -> str:
    """``:red_circle: [CRITICAL] crash raised on vehicle_edr car-1 at fleet-2: ...`` for chat webhooks."""
    if alert.get("state") == "cleared":
        emoji = CLEARED_EMOJI
    else:
        emoji = EMOJI.get(alert.get("severity", ""), ":grey_question:")
    return f"{emoji} {headline(alert)}"


def human_age(seconds: float) -> str:
    """``42s``, ``7m05s``, ``3h12m``, ``2d04h``: short enough for a table column."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str | float | int) -> float:
    """Seconds from ``90``, ``"90s"``, ``"15m"``, ``"2h"``, ``"1d"`` or ``"1h30m"``; ValueError otherwise."""
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError(f"duration {text} is negative")
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        if text.strip().replace(".", "", 1).isdigit():
            return float(text)
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 15m, 2h, 1d, 1h30m)")
    return sum(float(n) * _UNITS[u] for n, u in parts)
