"""Alert records on the real broker, and a webhook receiver that fails on purpose."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
import pytest
from confluent_kafka import Producer

from iotwatch.clients.kafka import ensure_topics
from iotwatch.contract.alerts import AlertRecord, alert_as_dict, alert_message
from iotwatch.contract.detection import Rule
from iotwatch.settings import KafkaSettings
from iotwatch.streaming.alerting import alert_id

DEVICES = [
    ("car-1", "vehicle_edr", "fleet-2"),
    ("car-2", "vehicle_edr", "fleet-1"),
    ("hvac-1", "thermostat", "home-1"),
    ("hvac-2", "thermostat", "home-2"),
    ("meter-1", "smart_meter", "home-1"),
]
RULES = [
    (Rule.CRASH, "critical"),
    (Rule.STUCK_HVAC, "major"),
    (Rule.ANOMALY_SCORE, "minor"),
    (Rule.DEVICE_SILENT, "warning"),
]


def make_alert(
    device_id: str, device_type: str, site: str, rule: str, severity: str, state: str, start_ms: int, **extra: Any
) -> AlertRecord:
    """A record as iotwatch.streaming.alerting publishes it (``extra`` sets or overrides fields)."""
    verb = "raised" if state == "raised" else "cleared"
    fields: dict[str, Any] = {
        "alert_id": alert_id(device_id, rule, start_ms),
        "state": state,
        "severity": severity,
        "rule": rule,
        "detector": "rule",
        "device_id": device_id,
        "device_type": device_type,
        "site": site,
        "metric": "temperature_c",
        "value": 31.5,
        "score": 0.91,
        "threshold": 6.0,
        "fire_score": 0.75,
        "clear_score": 0.45,
        "contributors": [{"metric": "temperature_c", "value": 31.5, "score": 0.91}],
        "first_seq": 1,
        "seq": 3,
        "first_event_ms": start_ms,
        "last_event_ms": start_ms + 2000,
        "occurrences": 3,
        "detected_at_ms": int(time.time() * 1000),
        "model_version": "test",
        "message": f"[{severity.upper()}] {rule} {verb} on {device_type} {device_id} at {site}: value 31.5",
        **extra,
    }
    return msgspec.convert(fields, AlertRecord)


def changed(alert: AlertRecord, **fields: Any) -> AlertRecord:
    """``alert`` with some fields changed, validated as decoding would (its time texts follow)."""
    body = {
        k: v for k, v in alert_as_dict(alert).items() if k not in ("first_event_time", "last_event_time", "detected_at")
    }
    return msgspec.convert({**body, **fields}, AlertRecord)


def alert_run(episodes: int, start_ms: int | None = None) -> list[AlertRecord]:
    """``episodes`` raise/clear pairs over the test devices and rules (raises before their clears)."""
    start_ms = start_ms or int(time.time() * 1000) - 600_000
    raised, cleared = [], []
    for i in range(episodes):
        device, dtype, site = DEVICES[i % len(DEVICES)]
        rule, severity = RULES[i % len(RULES)]
        raised.append(make_alert(device, dtype, site, rule, severity, "raised", start_ms + i * 1000))
        cleared.append(make_alert(device, dtype, site, rule, severity, "cleared", start_ms + i * 1000))
    return raised + cleared


def produce(kafka: KafkaSettings, topic: str, records: list[AlertRecord | bytes]) -> None:
    """Publish as the streaming job does: the encoded record keyed by device_id, header alert_id
    (raw bytes as they are, keyed ``garbage``)."""
    ensure_topics(kafka, [topic])
    producer = Producer({**kafka.client_config(), "enable.idempotence": True, "linger.ms": 5})
    for record in records:
        if isinstance(record, bytes):
            producer.produce(topic, record, key=b"garbage")
            continue
        key, value, headers = alert_message(record)
        producer.produce(topic, value, key=key, headers=headers)
    assert producer.flush(30) == 0


def key(alert: AlertRecord) -> str:
    return f"{alert.alert_id}:{alert.state}"


@dataclass
class FlakyWebhook:
    """A receiver that answers 503 to every ``fail_every``-th request, 429 + Retry-After once,
    stalls once past the client's timeout (then answers 200: delivered, though the client gave up),
    and 400 for alert ids in ``reject`` (an alert record, or a group notification listing one)."""

    fail_every: int = 3
    retry_after_at: int | None = 4  # request number answered 429 Retry-After: 1
    stall_at: int | None = 5  # request number that stalls ``stall_s`` then answers 200
    stall_s: float = 1.5
    delay_s: float = 0.0
    reject: set[str] = field(default_factory=set)
    requests: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)  # (idempotency key, status, body)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def delivered(self) -> list[str]:
        with self.lock:
            return [k for k, status, _ in self.requests if 200 <= status < 300]

    def answer(self, key_: str, body: dict[str, Any]) -> tuple[int, dict[str, str], float]:
        with self.lock:
            n = len(self.requests) + 1
            listed = {body.get("alert_id")} | {a.get("alert_id") for a in body.get("alerts", [])}  # one or a group
            if listed & self.reject:
                status, headers, sleep = 400, {}, 0.0
            elif n == self.retry_after_at:
                status, headers, sleep = 429, {"Retry-After": "1"}, 0.0
            elif n == self.stall_at:
                status, headers, sleep = 200, {}, self.stall_s
            elif self.fail_every and n % self.fail_every == 0:
                status, headers, sleep = 503, {}, 0.0
            else:
                status, headers, sleep = 200, {}, self.delay_s
            self.requests.append((key_, status, body))
        return status, headers, sleep

    def serve(self) -> tuple[ThreadingHTTPServer, str]:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, headers, sleep = hook.answer(self.headers.get("Idempotency-Key", ""), body)
                time.sleep(sleep)
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:
                    pass  # the client gave up (timeout) or was killed

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        return server, f"http://127.0.0.1:{server.server_address[1]}/hook"


@pytest.fixture
def webhook() -> Iterator[Callable[..., tuple[FlakyWebhook, str]]]:
    """Factory: ``hook, url = webhook(fail_every=3, ...)``; servers stop at teardown."""
    servers: list[ThreadingHTTPServer] = []

    def start(**kwargs: Any) -> tuple[FlakyWebhook, str]:
        hook = FlakyWebhook(**kwargs)
        server, url = hook.serve()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return hook, url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
