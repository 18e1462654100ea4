"""The dead-letter record every stage writes for input it cannot accept.

The Kafka value is the original bytes, untouched, so the record can be inspected or
replayed as it arrived (an input too large for that is cut to an :func:`excerpt`); the
why and where travel in headers. The key is the device id when it could be read, else
the MQTT topic, so dead letters of one device stay in order.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

H_REASON = "iotwatch.reason"  # short stable code, e.g. invalid_json, missing_field
H_DETAIL = "iotwatch.detail"  # human explanation
H_STAGE = "iotwatch.stage"  # gateway | stream
H_MQTT_TOPIC = "mqtt.topic"
H_MQTT_QOS = "mqtt.qos"
H_INGEST_MS = "iotwatch.ingest_ms"  # when the gateway received the message
H_GATEWAY = "iotwatch.gateway"  # which gateway instance forwarded it
H_ORIGINAL_BYTES = "iotwatch.original_bytes"  # size of the input when the value is only an excerpt of it
H_ORIGINAL_SHA256 = "iotwatch.original_sha256"  # hex SHA-256 of the whole input, when the value is an excerpt

Headers = list[tuple[str, bytes]]


@dataclass(frozen=True)
class DeadLetter:
    reason: str
    detail: str
    stage: str
    original: bytes
    key: bytes | None = None
    mqtt_topic: str | None = None

    def headers(self, extra: Sequence[tuple[str, bytes]] = ()) -> Headers:
        headers = [
            (H_REASON, self.reason.encode()),
            (H_DETAIL, self.detail[:1000].encode()),
            (H_STAGE, self.stage.encode()),
            ("iotwatch.dead_at_ms", str(int(time.time() * 1000)).encode()),
        ]
        if self.mqtt_topic is not None:
            headers.append((H_MQTT_TOPIC, self.mqtt_topic.encode(errors="replace")))
        return headers + list(extra)


def excerpt(original: bytes, limit: int) -> tuple[bytes, Headers]:
    """What a dead letter carries of an input too large to carry whole: its first ``limit``
    bytes, and headers with its size and hash (so it can be matched to the device's copy).
    A record as large as the input would be refused by Kafka and wedge the stage."""
    return original[:limit], [
        (H_ORIGINAL_BYTES, str(len(original)).encode()),
        (H_ORIGINAL_SHA256, hashlib.sha256(original).hexdigest().encode()),
    ]


def header_value(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> str | None:
    """The first header ``name`` decoded as UTF-8, or None."""
    for key, value in headers or ():
        if key == name and value is not None:
            return value.decode(errors="replace")
    return None
