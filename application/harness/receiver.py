"""The run's on-call receiver: where the forwarder (``iotwatch alerts forward``) sends its
notifications, counted so a run can prove every alert record was notified."""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


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
