"""Typed records of the on-call topics (schema version 1): one record type per topic.

Every topic here is compacted by its key, so the latest record per key is the current
state and replaying the topic from the beginning rebuilds it (event sourcing, no side
database). The streaming job's own ``raised``/``cleared`` records stay in ``iot.alerts``;
an alert's state is the fold of both logs (:mod:`iotwatch.alerts.book`).

docs/contract.md lists each topic with its key and record.

A device twin is two records, one per side, each with one writer: operators write
``desired`` (``devices set``), the responder writes what devices report on MQTT
(``reported``); the twin is the pair (:func:`twin_key`).

Decoding is strict (unknown fields, wrong types, other versions are :class:`BadRecord`):
a consumer dead-letters or reports such a record, it never guesses.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Any, TypeVar

import msgspec

from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.device_commands import TwinProperties

ONCALL_SCHEMA_VERSION = 1


class BadRecord(ValueError):
    """A record on an on-call topic that does not follow this schema."""


class AlertStep(StrEnum):
    ACKNOWLEDGED = "acknowledged"  # an operator (``alerts ack``)
    UNACKNOWLEDGED = "unacknowledged"  # an operator took it back (``alerts unack``)
    CLEARED_AFTER_ACK = "cleared_after_ack"  # the acknowledged alert cleared (written by the forwarder)


class AlertState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """The last on-call step of an alert. ``by``, ``at_ms`` and ``note`` are the acknowledgement's
    (a ``cleared_after_ack`` record carries them on, so compaction loses nothing) and
    ``cleared_at_ms`` when the alert cleared."""

    v: int
    alert_id: str
    action: AlertStep
    by: str
    at_ms: int
    note: str | None = None
    cleared_at_ms: int | None = None

    @property
    def acknowledged(self) -> bool:
        return self.action in (AlertStep.ACKNOWLEDGED, AlertStep.CLEARED_AFTER_ACK)


class Matchers(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Equality matchers on alert fields; every one given must match (none given: refused)."""

    site: str | None = None
    device_id: str | None = None
    rule: str | None = None
    severity: str | None = None

    def matches(self, alert: AlertRecord) -> bool:
        return all(value is None or alert.field(name) == value for name, value in msgspec.structs.asdict(self).items())

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in msgspec.structs.asdict(self).items() if v is not None)


class Silence(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Alerts matching ``matchers`` are not notified from ``starts_at_ms`` until ``ends_at_ms``;
    ``alerts unsilence`` rewrites the record with an earlier end and who revoked it."""

    v: int
    silence_id: str
    matchers: Matchers
    starts_at_ms: int
    ends_at_ms: int
    created_by: str
    comment: str | None = None
    revoked_by: str | None = None

    def active(self, now_ms: int) -> bool:
        return self.starts_at_ms <= now_ms < self.ends_at_ms

    def silences(self, alert: AlertRecord, now_ms: int) -> bool:
        return self.active(now_ms) and self.matchers.matches(alert)


class NotificationKind(StrEnum):
    FIRING = "firing"  # new alerts in the group (or the first notification)
    REPEAT = "repeat"  # unacknowledged critical alerts still firing after the repeat interval
    RESOLVED = "resolved"  # only resolutions since the last notification


class Notification(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """The last notification a receiver was sent for a group: which alerts it listed as
    firing and as resolved, and when. The forwarder rebuilds its timers from these."""

    v: int
    receiver: str
    group_key: str
    kind: NotificationKind
    sent_at_ms: int
    firing: list[str] = []
    resolved: list[str] = []
    #: firing alerts whose repeat was due in this notification (critical, unacknowledged)
    repeated: list[str] = []


class CommandOutcome(StrEnum):
    SENT = "sent"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    DONE = "done"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    ESCALATED = "escalated"  # every attempt failed or timed out: on-call must act


class CommandStep(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One line of a command's audit trail."""

    status: CommandOutcome
    at_ms: int
    reason: str | None = None


class CommandAudit(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Who or what issued a command, why, every reply, and the outcome so far."""

    v: int
    command_id: str
    policy: str
    alert_id: str
    rule: str
    device_id: str
    device_type: str
    site: str
    name: str
    issued_by: str
    issued_at_ms: int
    expires_at_ms: int
    attempt: int
    status: CommandOutcome
    args: dict[str, Any] = {}
    history: list[CommandStep] = []

    def with_step(self, status: CommandOutcome, at_ms: int, reason: str | None = None) -> CommandAudit:
        return msgspec.structs.replace(self, status=status, history=[*self.history, CommandStep(status, at_ms, reason)])


class TwinSide(StrEnum):
    DESIRED = "desired"  # what operators want (``devices set``)
    REPORTED = "reported"  # what the device says it has


class TwinRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One side of a device twin. ``version`` counts the desired side's changes (the command
    that delivers version n has a deterministic id from device and n); ``by`` is the operator
    or, for reported, the device."""

    v: int
    device_id: str
    device_type: str
    site: str
    side: TwinSide
    properties: TwinProperties
    at_ms: int
    by: str
    version: int = 0
    command_id: str | None = None


def twin_key(device_id: str, side: TwinSide) -> str:
    return f"{device_id}|{side.value}"


class Emergency(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """An emergency notification record (a crash): what happened, where, and when, for the
    emergency services' integration to pick up; one per alert."""

    v: int
    alert_id: str
    policy: str
    rule: str
    device_id: str
    device_type: str
    site: str
    detected_at_ms: int
    issued_at_ms: int
    issued_by: str
    message: str
    location: dict[str, float] = {}  # lat_deg/lon_deg when the alert carried them


R = TypeVar("R", AlertState, Silence, Notification, CommandAudit, TwinRecord, Emergency)


def decode(raw: bytes | None, kind: type[R]) -> R:
    """The record in one Kafka value, or :class:`BadRecord` naming what is wrong."""
    if raw is None:
        raise BadRecord(f"{kind.__name__}: empty value (a tombstone)")
    try:
        record = msgspec.json.decode(raw, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise BadRecord(f"{kind.__name__}: {exc}") from None
    if record.v != ONCALL_SCHEMA_VERSION:
        raise BadRecord(f"{kind.__name__}: v={record.v}, supported [{ONCALL_SCHEMA_VERSION}]")
    return record


def encode(record: AlertState | Silence | Notification | CommandAudit | TwinRecord | Emergency) -> bytes:
    return msgspec.json.encode(record)


def stable_id(*parts: object, length: int = 16) -> str:
    """A deterministic id from ``parts``: the same inputs give the same record key."""
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:length]
