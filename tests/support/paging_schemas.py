"""The published request schemas of the on-call tools iotwatch sends to, as JSON Schema, and a
real HTTP receiver that checks every request against one of them.

- PagerDuty Events API v2, ``POST /v2/enqueue`` (developer.pagerduty.com, "Send an Alert Event"):
  ``routing_key`` and ``event_action`` required; ``dedup_key`` at most 255 characters; a
  ``trigger`` needs ``payload`` with ``summary`` (at most 1,024 characters), ``source`` and
  ``severity`` (critical, error, warning, info); ``links`` need ``href``.
- Prometheus Alertmanager API v2, ``POST /api/v2/alerts`` (``api/v2/openapi.yaml`` of
  prometheus/alertmanager): ``postableAlerts``, an array of ``postableAlert``: ``labels`` (a
  ``labelSet``: string values) required, ``annotations`` a ``labelSet``, ``startsAt``/``endsAt``
  date-times, ``generatorURL`` a URI.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest

_PAGERDUTY_PAYLOAD = {
    "type": "object",
    "required": ["summary", "source", "severity"],
    "properties": {
        "summary": {"type": "string", "minLength": 1, "maxLength": 1024},
        "source": {"type": "string", "minLength": 1},
        "severity": {"enum": ["critical", "error", "warning", "info"]},
        "timestamp": {"type": "string", "format": "date-time"},
        "component": {"type": "string"},
        "group": {"type": "string"},
        "class": {"type": "string"},
        "custom_details": {"type": "object"},
    },
    "additionalProperties": False,
}
PAGERDUTY_EVENT: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["routing_key", "event_action"],
    "properties": {
        "routing_key": {"type": "string", "minLength": 1},
        "event_action": {"enum": ["trigger", "acknowledge", "resolve"]},
        "dedup_key": {"type": "string", "maxLength": 255},
        "payload": _PAGERDUTY_PAYLOAD,
        "images": {
            "type": "array",
            "items": {"type": "object", "required": ["src"], "properties": {"src": {"type": "string"}}},
        },
        "links": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["href"],
                "properties": {"href": {"type": "string", "format": "uri"}, "text": {"type": "string"}},
            },
        },
        "client": {"type": "string"},
        "client_url": {"type": "string", "format": "uri"},
    },
    "additionalProperties": False,
    # a trigger opens an alert: it needs the payload; acknowledge and resolve name it by its dedup key
    "if": {"properties": {"event_action": {"const": "trigger"}}},
    "then": {"required": ["payload"]},
    "else": {"required": ["dedup_key"]},
}
_LABEL_SET = {"type": "object", "additionalProperties": {"type": "string"}}
ALERTMANAGER_ALERTS: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "array",
    "items": {
        "type": "object",
        "required": ["labels"],
        "properties": {
            "labels": _LABEL_SET,
            "annotations": _LABEL_SET,
            "startsAt": {"type": "string", "format": "date-time"},
            "endsAt": {"type": "string", "format": "date-time"},
            "generatorURL": {"type": "string", "format": "uri"},
        },
    },
}


#: The formats the schemas use, checked here: jsonschema checks ``date-time`` and ``uri`` only
#: with optional packages installed, and would otherwise pass anything.
FORMATS = jsonschema.FormatChecker(formats=())


@FORMATS.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    """RFC 3339: a date, ``T``, a time and an offset (``Z`` or ``+hh:mm``)."""
    if not isinstance(value, str):
        return True
    if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", value):
        raise ValueError(f"{value!r} is not an RFC 3339 date-time")
    datetime.fromisoformat(value.replace("Z", "+00:00"))
    return True


@FORMATS.checks("uri", raises=ValueError)
def _uri(value: object) -> bool:
    """An absolute URI: a scheme and, for http(s), a host."""
    if not isinstance(value, str):
        return True
    parts = urlsplit(value)
    if not parts.scheme or (parts.scheme in ("http", "https") and not parts.netloc):
        raise ValueError(f"{value!r} is not an absolute URI")
    return True


def check(schema: dict[str, Any], body: Any) -> list[str]:
    """Every way ``body`` breaks ``schema`` (formats checked too), empty when it conforms."""
    validator = jsonschema.Draft202012Validator(schema, format_checker=FORMATS)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(body)]


@dataclass
class SchemaReceiver:
    """An HTTP receiver that answers 202 to a body that conforms to ``schema`` and 400 (with
    the violations) to one that does not, as the real APIs do; it keeps every body."""

    schema: dict[str, Any]
    accepted: list[Any] = field(default_factory=list)
    refused: list[tuple[Any, list[str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def serve(self) -> tuple[ThreadingHTTPServer, str]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                errors = check(receiver.schema, body)
                with receiver.lock:
                    (receiver.refused.append((body, errors)) if errors else receiver.accepted.append(body))
                answer = json.dumps({"errors": errors} if errors else {"status": "success"}).encode()
                self.send_response(400 if errors else 202)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def schema_receiver() -> Iterator[Callable[[dict[str, Any]], tuple[SchemaReceiver, str]]]:
    """Factory: ``receiver, base_url = schema_receiver(PAGERDUTY_EVENT)``; servers stop at teardown."""
    servers: list[ThreadingHTTPServer] = []

    def start(schema: dict[str, Any]) -> tuple[SchemaReceiver, str]:
        receiver = SchemaReceiver(schema)
        server, url = receiver.serve()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return receiver, url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
