"""Filtering and describing alert records (:class:`iotwatch.contract.alerts.AlertRecord`)
for people: ``tail`` and ``forward`` use the same words, so ``tail`` shows exactly what
``forward`` would send.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from iotwatch.contract.alerts import AlertRecord, severity_rank
from iotwatch.errors import UserError

#: Slack emoji per severity; a cleared alert is green whatever its severity.
EMOJI = {
    "critical": ":red_circle:",
    "major": ":large_orange_circle:",
    "minor": ":large_yellow_circle:",
    "warning": ":large_blue_circle:",
}
CLEARED_EMOJI = ":large_green_circle:"


@dataclass(frozen=True)
class AlertFilter:
    """What ``tail`` shows: a minimum severity and allow-lists by alert field (empty = any)."""

    min_severity: str | None = None
    allowed: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, min_severity: str | None = None, **allowed: Iterable[str]) -> AlertFilter:
        """``AlertFilter.of("major", site=["home-1"], rule=[])``: an empty list allows any."""
        return cls(min_severity, {name: frozenset(values) for name, values in allowed.items() if values})

    def matches(self, alert: AlertRecord) -> bool:
        if self.min_severity and alert.severity_rank > severity_rank(self.min_severity):
            return False
        return all(alert.field(name) in values for name, values in self.allowed.items())


def headline(alert: AlertRecord) -> str:
    """The one-line description: the record's own ``message``, or one built like it."""
    if alert.message:
        return alert.message
    where = f"{alert.device_type} {alert.device_id} at {alert.site}"
    return f"[{alert.severity.upper()}] {alert.rule} {alert.state} on {where}"


def slack_text(alert: AlertRecord) -> str:
    """``:red_circle: [CRITICAL] crash raised on vehicle_edr car-1 at fleet-2: ...`` for chat webhooks."""
    emoji = CLEARED_EMOJI if not alert.raised else EMOJI.get(alert.severity, ":grey_question:")
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
            raise UserError(f"duration {text} is negative")
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        if text.strip().replace(".", "", 1).isdigit():
            return float(text)
        raise UserError(f"{text!r} is not a duration (e.g. 90s, 15m, 2h, 1d, 1h30m)")
    return sum(float(n) * _UNITS[u] for n, u in parts)
