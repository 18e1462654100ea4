"""The alert record (schema version 1): one JSON object per Kafka message on the alert topic
(``settings.topics.alerts``, ``iot.alerts``), keyed by device id so a device's alerts stay
in order.

Producers and consumers: docs/contract.md.

``alert_id`` is deterministic (a hash of device, rule and the event time the episode
started), so a replay or a restart rewrites the same id: consumers deduplicate on it.
Decoding accepts fields it does not know (a newer producer may add some) and records
without ``v`` (written before the field existed) as version 1; it refuses other versions
and wrong types with :class:`BadAlert`.

>>> record = AlertRecord(alert_id="a1", state=AlertLifecycle.RAISED, severity=Severity.MAJOR,
...     rule="anomaly", detector="declared_levels", device_id="d-1", device_type="thermostat",
...     site="home-1", score=0.97, first_event_ms=0, detected_at_ms=5, message="m")
>>> decode_alert(encode_alert(record)) == record
True
>>> record.raised, record.severity_rank
(True, 1)
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum

import msgspec

ALERT_SCHEMA_VERSION = 1


def iso_time(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC (``2025-11-22T04:00:00.000Z``): every time in the
    text of an alert record, whoever writes it (the job, the responder's escalations).

    >>> iso_time(1_763_784_000_000)
    '2025-11-22T04:00:00.000Z'
    """
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class BadAlert(ValueError):
    """A record on the alert topic that is not an alert (kept apart so it can be dead-lettered)."""


class AlertLifecycle(StrEnum):
    """An alert record is either the start or the end of an episode."""

    RAISED = "raised"
    CLEARED = "cleared"


class Severity(StrEnum):
    """Severities, most severe first (the order :attr:`AlertRecord.severity_rank` uses)."""

    CRITICAL = "critical"
    MAJOR = "major"
    MINOR = "minor"
    WARNING = "warning"


SEVERITIES: tuple[str, ...] = tuple(s.value for s in Severity)
STATES: tuple[str, ...] = tuple(s.value for s in AlertLifecycle)


def severity_rank(severity: object) -> int:
    """0 for critical ... 3 for warning; anything else ranks below warning.

    >>> severity_rank("critical"), severity_rank("warning"), severity_rank("loud")
    (0, 3, 4)
    """
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


class Contributor(msgspec.Struct, frozen=True):
    """One metric behind an anomaly alert, strongest first: its value and its score."""

    metric: str
    value: float | None
    score: float


class AlertRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One ``raised`` or ``cleared`` alert."""

    v: int = ALERT_SCHEMA_VERSION
    alert_id: str  # a hash of device, rule and the event time the episode started
    state: AlertLifecycle
    severity: Severity
    rule: str  # a rule of iotwatch.streaming.rules (or iotwatch.responder.escalation.RULE)
    detector: str  # which rule family or detector: rule, declared_levels, fleet, responder, ...
    device_id: str
    device_type: str
    site: str
    #: the metric the alert is about (None: the whole device, e.g. silence or crash)
    metric: str | None = None
    value: float | None = None  # the metric's value at the reading
    #: in [0, 1]; a cleared record carries the episode's peak
    score: float
    threshold: float | None = None
    fire_score: float | None = None  # the score that raises the alert
    clear_score: float | None = None  # the score it clears below
    contributors: list[Contributor] = []
    first_seq: int | None = None  # the reading that started the episode
    seq: int | None = None  # the reading that raised or cleared the alert
    first_event_ms: int  # event time the episode started, epoch milliseconds
    first_event_time: str = ""  # first_event_ms as ISO 8601 UTC
    last_event_ms: int | None = None  # event time of the reading that raised or cleared it
    last_event_time: str | None = None  # last_event_ms as ISO 8601 UTC
    occurrences: int = 1
    detected_at_ms: int  # when the writer detected it (wall clock), epoch milliseconds
    detected_at: str = ""  # detected_at_ms as ISO 8601 UTC
    model_version: str | None = None
    message: str  # the alert in words, as notifications show it
    runbook_url: str | None = None  # the rule's runbook
    lat_deg: float | None = None  # where a vehicle was at the reading (vehicles report lat_deg/lon_deg)
    lon_deg: float | None = None  # (with lat_deg)
    caused_by: str | None = None  # an escalation's original alert
    command_id: str | None = None  # an escalation's command that failed
    policy: str | None = None  # an escalation's policy

    def __post_init__(self) -> None:
        if not self.alert_id:
            raise ValueError("alert_id is empty")
        if not self.first_event_time:
            msgspec.structs.force_setattr(self, "first_event_time", iso_time(self.first_event_ms))
        if not self.detected_at:
            msgspec.structs.force_setattr(self, "detected_at", iso_time(self.detected_at_ms))
        if self.last_event_ms is not None and self.last_event_time is None:
            msgspec.structs.force_setattr(self, "last_event_time", iso_time(self.last_event_ms))

    @property
    def raised(self) -> bool:
        return self.state == AlertLifecycle.RAISED

    @property
    def start_seq(self) -> int | None:
        """The reading the episode started at (``first_seq``; ``seq`` for a record without it)."""
        return self.first_seq if self.first_seq is not None else self.seq

    @property
    def severity_rank(self) -> int:
        return severity_rank(self.severity)

    @property
    def location(self) -> dict[str, float]:
        """``lat_deg``/``lon_deg`` when the record carries them."""
        return {k: v for k, v in (("lat_deg", self.lat_deg), ("lon_deg", self.lon_deg)) if v is not None}

    def field(self, name: str) -> object:
        """A field by name (matchers and filters name the field they compare)."""
        return getattr(self, name, None)


_DECODER = msgspec.json.Decoder(AlertRecord)
_ENCODER = msgspec.json.Encoder()


def decode_alert(value: bytes | None) -> AlertRecord:
    """The alert in one Kafka value, or :class:`BadAlert` saying what is wrong with it."""
    if value is None:
        raise BadAlert("empty value")
    try:
        record = _DECODER.decode(value)
    except msgspec.ValidationError as exc:
        raise BadAlert(f"not an alert record: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise BadAlert(f"not JSON: {exc}") from None
    if record.v != ALERT_SCHEMA_VERSION:
        raise BadAlert(f"alert v={record.v}, supported [{ALERT_SCHEMA_VERSION}]")
    return record


def encode_alert(record: AlertRecord) -> bytes:
    """The record's JSON, every field written (None as null) so readers of the raw topic see
    the whole shape."""
    return _ENCODER.encode(record)


def alert_message(record: AlertRecord) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """The record as a message of the alert topic: key, value and headers. The key is the
    device, so its alerts keep their order; the ``alert_id`` header lets a reader skip a
    record without decoding it."""
    return record.device_id.encode(), encode_alert(record), [("alert_id", record.alert_id.encode())]


def alert_as_dict(record: AlertRecord) -> dict[str, object]:
    """The record as plain JSON types (for ``--json`` output and webhooks' bodies)."""
    as_dict: dict[str, object] = msgspec.to_builtins(record)  # a Struct becomes a dict
    return as_dict
