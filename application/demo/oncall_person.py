"""The demo's on-call side, so the on-call dashboard has something to show: a local receiver
for ``alerts forward --routes`` to notify, and an on-call person who acknowledges alerts.

The forwarder is what writes the on-call measurements (alerts by state, time to acknowledge,
time to clear); without it in the demo those panels stayed empty. The receiver only counts
what it gets; the on-call person acknowledges the oldest open alert every ``every_s``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from iotwatch.alerts.actions import acknowledge
from iotwatch.alerts.book import load_book
from iotwatch.errors import IotwatchError
from iotwatch.settings import Settings

#: Who the demo's acknowledgements name.
ON_CALL = "demo-oncall"


class Receiver:
    """A webhook receiver on 127.0.0.1 that answers 200 and counts notifications, and how
    often each ``Idempotency-Key`` came (a receiver deduplicates by it)."""

    def __init__(self) -> None:
        self.notifications = 0
        self.keys: Counter[str] = Counter()
        receiver = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    receiver.notifications += 1
                    receiver.keys[self.headers.get("Idempotency-Key", "")] += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notify"

    def write_routes(self, path: Path) -> Path:
        """A routing file: everything to this receiver, grouped by site and rule."""
        path.write_text(
            f'[receivers.demo]\nurl = "{self.url}"\n\n[route]\nreceiver = "demo"\n'
            'group_by = ["site", "rule"]\ngroup_wait = "2s"\ngroup_interval = "10s"\n'
            'repeat_interval = "1m"\n'
        )
        return path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
