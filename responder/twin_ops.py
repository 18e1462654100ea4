"""The operators' side of the device twin: read a device's twin, set desired properties.

``set`` writes the twin's ``desired`` record and an audit record and sends a ``set_properties``
command, so the twin's changes share the commands' delivery, expiry and replies
(docs/operate/oncall.md, "Device twins"; with sites, docs/sites.md).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from confluent_kafka import Producer

from iotwatch.clients.kafka import client_config, ensure_topics, produce_confirmed, read_to_end
from iotwatch.contract.device_commands import (
    SET_PROPERTIES,
    TWIN_PROPERTIES,
    Command,
    TwinProperties,
    twin_properties,
)
from iotwatch.contract.oncall import (
    ONCALL_SCHEMA_VERSION,
    BadRecord,
    CommandAudit,
    CommandOutcome,
    TwinRecord,
    TwinSide,
    decode,
    encode,
    stable_id,
    twin_key,
)
from iotwatch.contract.telemetry import ContractViolation
from iotwatch.errors import IotwatchError
from iotwatch.settings import Settings

#: The ``policy`` an operator's twin command has in the audit trail.
OPERATOR_POLICY = "operator-twin"


@dataclass
class Twin:
    """Both sides of one device's twin (either may be missing)."""

    device_id: str
    desired: TwinRecord | None = None
    reported: TwinRecord | None = None

    def rows(self) -> list[dict[str, Any]]:
        """Per property: desired, reported, and whether the device has what was asked for."""
        want = self.desired.properties.as_dict() if self.desired else {}
        have = self.reported.properties.as_dict() if self.reported else {}
        return [
            {
                "property": name,
                "desired": want.get(name),
                "reported": have.get(name),
                "state": "" if name not in want else "in sync" if want[name] == have.get(name) else "pending",
            }
            for name in TWIN_PROPERTIES
            if name in want or name in have
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "device_id": self.device_id,
            "properties": self.rows(),
            **{
                side: msgspec.to_builtins(record) if record else None
                for side, record in (("desired", self.desired), ("reported", self.reported))
            },
        }


def read_twin(settings: Settings, device_id: str) -> Twin:
    """The device's twin as the twin topic has it now."""
    twin = Twin(device_id)
    keys = {twin_key(device_id, side).encode(): side for side in TwinSide}
    for message in read_to_end(settings.kafka, settings.topics.device_twin):
        side = keys.get(message.key() or b"")
        if side is None:
            continue
        try:
            record = decode(message.value(), TwinRecord)
        except BadRecord:
            continue  # a later record of the same key is what counts; a bad one is skipped
        setattr(twin, side.value, record)
    return twin


_CONNECTION_DETAIL = {
    "online": "",
    "offline": "said goodbye: marked offline, no silence alert",
    "lost": "its last will: silent, device_silent applies",
}


def read_connection(settings: Settings, twin: Twin) -> dict[str, Any]:
    """The device's retained status (:class:`iotwatch.contract.device_topics.DeviceStatus`):
    ``state`` online, offline or lost (None: never published), its time, and what it means."""
    from iotwatch.clients.mqtt import retained
    from iotwatch.contract.device_topics import status_topic

    known = twin.reported or twin.desired
    if known is None:
        return {"state": None, "ts": None, "detail": "site and type unknown"}
    try:
        payload = retained(settings.mqtt, status_topic(known.site, known.device_type, twin.device_id))
    except IotwatchError as exc:
        return {"state": None, "ts": None, "detail": str(exc)}
    if payload is None:
        return {"state": None, "ts": None, "detail": "no retained status"}
    try:
        status = json.loads(payload)
        state, ts = str(status["state"]), int(status["ts"])
    except (ValueError, KeyError, TypeError):
        return {"state": None, "ts": None, "detail": f"unreadable status {payload[:80]!r}"}
    return {"state": state, "ts": ts, "detail": _CONNECTION_DETAIL.get(state, "")}


def parse_assignments(pairs: tuple[str, ...]) -> TwinProperties:
    """``key=value`` pairs as properties (``limp_mode=true``, ``setpoint_c=19.5``), or an error naming the bad one."""
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in TWIN_PROPERTIES:
            raise IotwatchError(f"{pair!r}: expected key=value with key one of {', '.join(TWIN_PROPERTIES)}")
        try:
            msgspec.convert({key: value}, TwinProperties, strict=False)
        except msgspec.ValidationError:
            raise IotwatchError(f"{pair!r}: {key} takes {_EXPECTED_VALUE[key]}") from None
        values[key] = value
    return msgspec.convert(values, TwinProperties, strict=False)


#: What each twin property takes, in the words of an operator's error message.
_EXPECTED_VALUE = {
    "setpoint_c": "a number of degrees Celsius, e.g. setpoint_c=19.5",
    "valve": "open or closed",
    "limp_mode": "true or false",
    "firmware": "a version of at most 64 characters, e.g. firmware=1.2.0",
}


def set_desired(
    settings: Settings,
    device_id: str,
    change: TwinProperties,
    by: str,
    ttl_s: float,
    site: str | None = None,
    device_type: str | None = None,
    now_ms: int | None = None,
) -> tuple[TwinRecord, Command]:
    """Record the desired change and send it to the device; returns the desired record and the command."""
    from iotwatch.responder.issuer import CommandIssuer, command_of

    if not change.as_dict():
        raise IotwatchError("nothing to set: give at least one key=value")
    twin = read_twin(settings, device_id)
    known = twin.reported or twin.desired
    site = site or (known.site if known else None)
    device_type = device_type or (known.device_type if known else None)
    if not site or not device_type:
        raise IotwatchError(f"device {device_id} has no twin yet: give --site and --type")
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    version = (twin.desired.version if twin.desired else 0) + 1
    command_id = stable_id(device_id, SET_PROPERTIES, version, length=24)
    wanted = (twin.desired.properties if twin.desired else TwinProperties()).merged(change)
    record = TwinRecord(
        ONCALL_SCHEMA_VERSION, device_id, device_type, site, TwinSide.DESIRED, wanted, now, by, version, command_id
    )
    audit = CommandAudit(
        ONCALL_SCHEMA_VERSION,
        command_id,
        OPERATOR_POLICY,
        "",
        "",
        device_id,
        device_type,
        site,
        SET_PROPERTIES,
        by,
        now,
        now + int(ttl_s * 1000),
        1,
        CommandOutcome.SENT,
        change.as_dict(),
    ).with_step(CommandOutcome.SENT, now, f"twin version {version} by {by}")
    command = command_of(audit)  # what a site's relay sends for the same record
    try:
        twin_properties(command.args)  # what the device will check
    except ContractViolation as exc:
        raise IotwatchError(str(exc)) from None
    topics = settings.topics
    ensure_topics(settings.kafka, [topics.device_twin, topics.commands], compacted=True)
    producer = Producer({**client_config(settings.kafka), "enable.idempotence": True})
    produce_confirmed(
        settings.kafka, producer, topics.device_twin, twin_key(device_id, TwinSide.DESIRED).encode(), encode(record)
    )
    produce_confirmed(settings.kafka, producer, topics.commands, command_id.encode(), encode(audit))
    if settings.respond.delivery == "sites":
        return record, command  # the audit record is the command: the device's site's relay delivers it
    issuer = CommandIssuer(settings.mqtt, f"iotwatch-operator-{by}-{time.time_ns()}", listen=False)
    issuer.connect()
    try:
        issuer.send(site, device_type, command)
    finally:
        issuer.close()
    return record, command
