"""Device commands and twin properties (schema version 1): the records of the closed loop
between the responder, operators and devices, carried on the topics of
:mod:`iotwatch.contract.device_topics`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal, Protocol, TypeVar

import msgspec

from iotwatch.contract.telemetry import MAX_PAYLOAD_BYTES, ContractViolation, FiniteFloat, Name

# --- device commands (schema version 1) ------------------------------------------------
#
# The closed loop: a command goes to ``iot/<site>/<device_type>/<device_id>/commands`` at
# QoS 1 (to a persistent session, so a device that was offline gets it when it reconnects),
# and the device answers each step on ``.../commands/ack``. A command past ``expires_at_ms``
# is not executed: the device answers ``rejected`` with reason ``expired``.

COMMAND_SCHEMA_VERSION = 1


class CommandStatus(StrEnum):
    """A device's answer to a command: ``accepted`` then ``done`` or ``failed``; or ``rejected``."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    DONE = "done"
    FAILED = "failed"


class Command(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """What a device is told to do. ``command_id`` is deterministic where the issuer is
    (the responder hashes alert, policy and attempt), so a re-sent command is recognised."""

    v: int
    command_id: Name
    device_id: Name
    name: Name  # e.g. reset_hvac, close_valve, limp_mode
    issued_at_ms: int  # epoch milliseconds
    expires_at_ms: int  # not executed from then on (rejected as expired)
    issued_by: str  # the responder, or the operator of `devices set`
    args: dict[str, Any] = {}  # set_properties: the properties to change
    reason: str | None = None  # why, e.g. the alert id

    def expired(self, now_ms: int) -> bool:
        return now_ms >= self.expires_at_ms


class CommandReply(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A device's answer on ``.../commands/ack``; ``reason`` says why it was rejected or failed."""

    v: int
    command_id: Name
    device_id: Name
    status: CommandStatus
    at_ms: int  # when the device answered, epoch milliseconds
    reason: str | None = None


_COMMAND_DECODER = msgspec.json.Decoder(Command)
_REPLY_DECODER = msgspec.json.Decoder(CommandReply)


class _HasVersion(Protocol):
    """A record of the command schema: it carries its schema version."""

    @property
    def v(self) -> int: ...


_Versioned = TypeVar("_Versioned", bound=_HasVersion)


def _decode_versioned(raw: bytes, decoder: msgspec.json.Decoder[_Versioned], what: str) -> _Versioned:
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise ContractViolation("too_large", f"{what}: {len(raw)} bytes > limit {MAX_PAYLOAD_BYTES}")
    try:
        record = decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise ContractViolation("invalid_field", f"{what}: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ContractViolation("invalid_json", f"{what}: {exc}") from None
    if record.v != COMMAND_SCHEMA_VERSION:
        raise ContractViolation("unsupported_version", f"{what}: v={record.v}, supported [{COMMAND_SCHEMA_VERSION}]")
    return record


def decode_command(raw: bytes) -> Command:
    """Parse and validate a command payload, or raise :class:`ContractViolation`."""
    return _decode_versioned(raw, _COMMAND_DECODER, "command")


def decode_command_reply(raw: bytes) -> CommandReply:
    """Parse and validate a command reply, or raise :class:`ContractViolation`."""
    return _decode_versioned(raw, _REPLY_DECODER, "command reply")


def encode(record: Command | CommandReply | TwinReport) -> bytes:
    """Compact JSON of a command, a reply or a twin report."""
    return msgspec.json.encode(record)


# --- device twin properties (schema version 1, with the commands) ----------------------
#
# Desired properties reach a device as a ``set_properties`` command (args: the properties to
# change) over the command path above, so they share its QoS 1 persistent delivery, expiry
# and replies. A device publishes what it actually has, retained, on ``.../twin/reported``
# after it starts and after every change; the responder records both sides in the twin topic.

#: The command that applies desired twin properties (``args``: a :class:`TwinProperties` dict).
SET_PROPERTIES = "set_properties"


class TwinProperties(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """The properties a twin knows; a device reports those it has (None: not this kind of device)."""

    setpoint_c: FiniteFloat | None = None  # thermostat
    valve: Literal["open", "closed"] | None = None  # leak sensor's shut-off valve
    limp_mode: bool | None = None  # vehicle: speed capped, engine load limited
    firmware: Annotated[str, msgspec.Meta(max_length=64)] | None = None

    def merged(self, other: TwinProperties) -> TwinProperties:
        """These properties with ``other``'s set ones on top."""
        return msgspec.structs.replace(
            self, **{k: v for k, v in msgspec.structs.asdict(other).items() if v is not None}
        )

    def as_dict(self) -> dict[str, Any]:
        """The properties that are set."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}


#: The twin property names, for operators' ``key=value`` input.
TWIN_PROPERTIES = tuple(f.name for f in msgspec.structs.fields(TwinProperties))


class TwinReport(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """What a device reports on ``.../twin/reported``."""

    v: int
    device_id: Name
    at_ms: int  # when the device reported, epoch milliseconds
    properties: TwinProperties


_TWIN_DECODER = msgspec.json.Decoder(TwinReport)


def decode_twin_report(raw: bytes) -> TwinReport:
    """Parse and validate a reported-twin payload, or raise :class:`ContractViolation`."""
    return _decode_versioned(raw, _TWIN_DECODER, "twin report")


def twin_properties(values: dict[str, Any]) -> TwinProperties:
    """Properties from a dict (a command's args, an operator's input), or :class:`ContractViolation`."""
    try:
        return msgspec.convert(values, TwinProperties)
    except msgspec.ValidationError as exc:
        raise ContractViolation("invalid_field", f"twin properties: {exc}") from None
