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

DEAD_LETTER_SCHEMA_VERSION = 1

H_VERSION = "iotwatch.dead_letter_v"  # the schema version of these headers
H_REASON = "iotwatch.reason"  # short stable code, e.g. invalid_json, missing_field
H_DETAIL = "iotwatch.detail"  # human explanation
H_STAGE = "iotwatch.stage"  # gateway | stream
H_MQTT_TOPIC = "mqtt.topic"
H_MQTT_QOS = "mqtt.qos"
H_INGEST_MS = "iotwatch.ingest_ms"  # when the gateway received the message
H_GATEWAY = "iotwatch.gateway"  # which gateway instance forwarded it
H_ORIGINAL_BYTES = "iotwatch.original_bytes"  # size of the input when the value is only an excerpt of it
H_ORIGINAL_SHA256 = "iotwatch.original_sha256"  # hex SHA-256 of the whole input, when the value is an excerpt
H_KAFKA_TOPIC = "kafka.topic"  # the topic the streaming job read the record from
H_KAFKA_PARTITION = "kafka.partition"  # the partition of that topic
H_KAFKA_OFFSET = "kafka.offset"  # the record's offset there: with the two above, where it is in the log

Headers = list[tuple[str, bytes]]


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter. Producers: the gateway, the streaming job, the responder and the alert
    forwarder (``stage`` says which). Consumers read it back with :meth:`of_message`: the
    demo's accounting, operators' tools and the tests."""

    reason: str
    detail: str
    stage: str
    original: bytes
    key: bytes | None = None
    mqtt_topic: str | None = None

    def headers(self, extra: Sequence[tuple[str, bytes]] = ()) -> Headers:
        headers = [
            (H_VERSION, str(DEAD_LETTER_SCHEMA_VERSION).encode()),
            (H_REASON, self.reason.encode()),
            (H_DETAIL, self.detail[:1000].encode()),
            (H_STAGE, self.stage.encode()),
            ("iotwatch.dead_at_ms", str(int(time.time() * 1000)).encode()),
        ]
        if self.mqtt_topic is not None:
            headers.append((H_MQTT_TOPIC, self.mqtt_topic.encode(errors="replace")))
        return headers + list(extra)

    @classmethod
    def of_message(
        cls, value: bytes | None, key: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None
    ) -> DeadLetter:
        """The dead letter in a Kafka message (value, key, headers); ValueError when it has no
        reason, or headers of another version (letters written before the version header read
        as version 1)."""
        version = header_value(headers, H_VERSION) or str(DEAD_LETTER_SCHEMA_VERSION)
        if version != str(DEAD_LETTER_SCHEMA_VERSION):
            raise ValueError(f"dead letter v={version}, supported [{DEAD_LETTER_SCHEMA_VERSION}]")
        reason = header_value(headers, H_REASON)
        if reason is None:
            raise ValueError(f"not a dead letter: no {H_REASON} header")
        return cls(
            reason,
            header_value(headers, H_DETAIL) or "",
            header_value(headers, H_STAGE) or "",
            value or b"",
            key,
            header_value(headers, H_MQTT_TOPIC),
        )


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
