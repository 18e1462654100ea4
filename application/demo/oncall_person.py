"""The demo's on-call person, so the on-call dashboard has something to show: it acknowledges
the oldest open alert every ``every_s`` (the forwarder notifies the harness's receiver,
:class:`iotwatch.application.harness.receiver.Receiver`, and writes the on-call measurements:
alerts by state, time to acknowledge, time to clear).
"""

from __future__ import annotations

import time

from iotwatch.alerts.actions import acknowledge
from iotwatch.alerts.book import load_book
from iotwatch.errors import IotwatchError
from iotwatch.settings import Settings

#: Who the demo's acknowledgements name.
ON_CALL = "demo-oncall"


class OnCallPerson:
    """Acknowledges the oldest open alert (not a device falling silent) at most every ``every_s``."""

    def __init__(self, settings: Settings, every_s: float = 10.0, min_age_s: float = 3.0) -> None:
        self.settings, self.every_s, self.min_age_ms = settings, every_s, int(min_age_s * 1000)
        self.acknowledged: list[str] = []
        self._next = time.monotonic() + every_s

    def step(self) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.every_s
        now = int(time.time() * 1000)
        book = load_book(self.settings, timeout_s=10)
        waiting = [
            v
            for v in book.select(open_only=True)
            if not v.acked and v.record.rule != "device_silent" and (v.raised_ms or now) <= now - self.min_age_ms
        ]
        if not waiting:
            return
        oldest = min(waiting, key=lambda v: v.raised_ms or 0)
        try:
            acknowledge(self.settings, book, oldest.alert_id, ON_CALL, "demo: looking into it")
        except IotwatchError:
            return  # cleared meanwhile
        self.acknowledged.append(oldest.alert_id)
