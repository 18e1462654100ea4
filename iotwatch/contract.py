"""The device message contract every component shares (schema version 1).

MQTT topic per reading: ``iot/<site>/<device_type>/<device_id>/telemetry``; each device
also keeps a retained ``iot/<site>/<device_type>/<device_id>/status`` (online/offline).

Payload (JSON object)::

    {"v": 1, "device_id": "home-003-thermostat-0", "device_type": "thermostat",
     "site": "home-003", "seq": 41, "ts": 1763784000000,
     "metrics": {"temperature_c": 21.4, "humidity_pct": 43.0},
     "event": null, "event_data": null}

``seq`` counts per device from 0, +1 per message, so every stage can account for loss and
duplicates; ``(device_id, seq)`` is the unique id of a reading. ``ts`` is event time in
epoch milliseconds, set by the device.

Validation is strict on purpose: a bad message goes to the dead-letter topic with the
reason from :class:`ContractViolation`, it is never coerced into something it was not.
"""

from __future__ import annotations

import json
import time
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})

#: Larger payloads are rejected. A vehicle crash event carries a pre-event buffer
#: (5 s at 10 Hz of ~15 metrics is ~20 KB of JSON), so the limit leaves ample room.
MAX_PAYLOAD_BYTES = 256 * 1024
#: Event times further than this in the future (device clock skew) are contract violations.
MAX_FUTURE_SKEW_MS = 24 * 3600 * 1000
#: Event times before this (2000-01-01) are contract violations: an unset device clock.
MIN_EVENT_TIME_MS = 946_684_800_000

_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
Name = Annotated[str, Field(pattern=_NAME_PATTERN)]


class DeviceType(StrEnum):
    """Kinds of device the simulators produce and the pipeline knows ranges for."""

    THERMOSTAT = "thermostat"
    SMART_METER = "smart_meter"
    AIR_QUALITY = "air_quality"
    DOOR_SENSOR = "door_sensor"
    LEAK_SENSOR = "leak_sensor"
    VEHICLE_EDR = "vehicle_edr"


class Telemetry(BaseModel):
    """One validated reading. Unknown top-level fields are rejected so typos surface."""

    model_config = ConfigDict(strict=True, frozen=True, allow_inf_nan=False, extra="forbid")

    v: int
    device_id: Name
    device_type: Name
    site: Name
    seq: int = Field(ge=0)
    ts: int = Field(description="event time, epoch milliseconds")
    metrics: dict[Annotated[str, Field(min_length=1, max_length=128)], float]
    event: Name | None = None
    event_data: dict[str, Any] | None = None

    def key(self) -> bytes:
        """The Kafka message key: per-device order holds within a partition."""
        return self.device_id.encode()

    def to_json(self) -> bytes:
        return json.dumps(self.model_dump(exclude_none=True), separators=(",", ":")).encode()


class ContractViolation(ValueError):
    """A payload that does not follow the contract; ``reason`` is a short stable code
    (for counting and dashboards) and ``detail`` says what exactly was wrong."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def decode_telemetry(
    raw: bytes,
    *,
    now_ms: int | None = None,
    max_bytes: int = MAX_PAYLOAD_BYTES,
    max_future_skew_ms: int = MAX_FUTURE_SKEW_MS,
) -> Telemetry:
    """Parse and validate a payload, or raise :class:`ContractViolation`."""
    if len(raw) > max_bytes:
        raise ContractViolation("too_large", f"{len(raw)} bytes > limit {max_bytes}")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractViolation("invalid_utf8", str(exc)) from None
    try:
        message = Telemetry.model_validate_json(raw)
    except ValidationError as exc:
        raise _violation_from(exc) from None
    if message.v not in SUPPORTED_VERSIONS:
        raise ContractViolation("unsupported_version", f"v={message.v}, supported {sorted(SUPPORTED_VERSIONS)}")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if message.ts > now + max_future_skew_ms:
        raise ContractViolation("ts_in_future", f"ts={message.ts} is more than {max_future_skew_ms} ms ahead")
    if message.ts < MIN_EVENT_TIME_MS:
        raise ContractViolation("ts_too_old", f"ts={message.ts} is before 2000-01-01")
    return message


def _violation_from(exc: ValidationError) -> ContractViolation:
    first = exc.errors(include_url=False)[0]
    kind = first["type"]
    where = ".".join(str(part) for part in first["loc"]) or "payload"
    detail = f"{where}: {first['msg']}"
    if kind == "json_invalid":
        return ContractViolation("invalid_json", detail)
    if kind in ("model_type", "model_attributes_type"):
        return ContractViolation("not_an_object", detail)
    if kind == "missing":
        return ContractViolation("missing_field", detail)
    if kind == "extra_forbidden":
        return ContractViolation("unknown_field", detail)
    if kind == "finite_number":
        return ContractViolation("non_finite_number", detail)
    return ContractViolation("invalid_field", detail)


# --- MQTT topics ---------------------------------------------------------------------

TELEMETRY_SUFFIX = "telemetry"
STATUS_SUFFIX = "status"


def telemetry_topic(site: str, device_type: str, device_id: str) -> str:
    return f"iot/{site}/{device_type}/{device_id}/{TELEMETRY_SUFFIX}"


def status_topic(site: str, device_type: str, device_id: str) -> str:
    return f"iot/{site}/{device_type}/{device_id}/{STATUS_SUFFIX}"


def parse_device_topic(topic: str) -> tuple[str, str, str, str]:
    """``iot/<site>/<type>/<id>/<kind>`` -> (site, device_type, device_id, kind)."""
    parts = topic.split("/")
    if len(parts) != 5 or parts[0] != "iot" or not all(parts):
        raise ContractViolation("bad_topic", f"{topic!r} is not iot/<site>/<device_type>/<device_id>/<kind>")
    return parts[1], parts[2], parts[3], parts[4]


def status_payload(online: bool, ts_ms: int) -> bytes:
    """The retained status message (and, for offline, the MQTT last will)."""
    return json.dumps({"v": SCHEMA_VERSION, "state": "online" if online else "offline", "ts": ts_ms}).encode()
