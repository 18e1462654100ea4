"""The current state of every alert and silence, folded from the event logs (the alert topic,
the operators' alert-state and silence topics): nothing is stored anywhere but Kafka, so every
tool rebuilds the same state by replaying them (docs/operate/oncall.md, "State is the event log").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

from iotwatch.clients.kafka import TopicFollower
from iotwatch.contract.alerts import AlertRecord, BadAlert, alert_as_dict, decode_alert, severity_rank
from iotwatch.contract.oncall import AlertState, AlertStep, BadRecord, Silence
from iotwatch.contract.oncall import decode as decode_record
from iotwatch.errors import IotwatchError
from iotwatch.settings import Settings

log = logging.getLogger(__name__)

OPEN, ACKNOWLEDGED, CLEARED, CLEARED_AFTER_ACK = "open", "acknowledged", "cleared", "cleared_after_ack"
#: The shortest alert-id prefix ``alerts ack`` accepts (ids are 24 hex digits).
MIN_PREFIX = 6


class UnknownAlert(IotwatchError):
    """No alert (or silence) has this id."""


@dataclass
class AlertView:
    """One alert: its raise, its clear (once cleared) and the last operator action."""

    alert_id: str
    raised: AlertRecord | None = None
    cleared: AlertRecord | None = None
    ack: AlertState | None = None

    @property
    def record(self) -> AlertRecord:
        """The alert's fields (the raise's, which describe the condition; the clear's if no raise
        was seen). Only for alerts seen on the alert topic: an operator step alone has none."""
        record = self.raised or self.cleared
        if record is None:
            raise LookupError(f"alert {self.alert_id}: only an operator step was seen, no alert record")
        return record

    @property
    def acknowledgement(self) -> AlertState | None:
        """The acknowledgement in force: None when nobody acknowledged or it was taken back."""
        return self.ack if self.ack is not None and self.ack.acknowledged else None

    @property
    def acked(self) -> bool:
        return self.acknowledgement is not None

    @property
    def firing(self) -> bool:
        return self.raised is not None and self.cleared is None

    @property
    def status(self) -> str:
        ack = self.acknowledgement
        if self.cleared is not None:
            return CLEARED_AFTER_ACK if ack is not None and ack.at_ms <= self.cleared.detected_at_ms else CLEARED
        if self.ack is not None and self.ack.action == AlertStep.CLEARED_AFTER_ACK:
            return CLEARED_AFTER_ACK  # the alert topic's clear is gone (retention); the state topic keeps it
        return ACKNOWLEDGED if self.acked else OPEN

    def needs_cleared_after_ack(self) -> bool:
        """Acknowledged, then cleared, and the alert-state topic does not say so yet."""
        return (
            self.cleared is not None
            and self.ack is not None
            and self.ack.action == AlertStep.ACKNOWLEDGED
            and self.ack.at_ms <= self.cleared.detected_at_ms
        )

    @property
    def raised_ms(self) -> int | None:
        return self.raised.detected_at_ms if self.raised else None

    def seconds_to_ack(self) -> float | None:
        ack = self.acknowledgement
        if ack is None or self.raised is None:
            return None
        return max(0.0, (ack.at_ms - self.raised.detected_at_ms) / 1000)

    def seconds_to_clear(self) -> float | None:
        if self.raised is None or self.cleared is None:
            return None
        return max(0.0, (self.cleared.detected_at_ms - self.raised.detected_at_ms) / 1000)

    def as_dict(self) -> dict[str, Any]:
        """The alert's fields plus its on-call state (what ``alerts list --json`` prints)."""
        ack = self.acknowledgement
        return {
            **alert_as_dict(self.record),
            "status": self.status,
            "raised_at_ms": self.raised_ms,
            "cleared_at_ms": self.cleared.detected_at_ms if self.cleared else None,
            "acked_by": ack.by if ack else None,
            "acked_at_ms": ack.at_ms if ack else None,
            "ack_note": ack.note if ack else None,
            "seconds_to_ack": self.seconds_to_ack(),
            "seconds_to_clear": self.seconds_to_clear(),
        }


def _ended_ms(view: AlertView) -> int:
    """When an alert that is not firing ended: its clear, else its last operator step."""
    if view.cleared is not None:
        return view.cleared.detected_at_ms
    return view.ack.at_ms if view.ack is not None else 0


@dataclass
class AlertBook:
    """Alerts by id and silences by id, folded record by record (order within a key is Kafka's)."""

    alerts: dict[str, AlertView] = field(default_factory=dict)
    silences: dict[str, Silence] = field(default_factory=dict)
    malformed: int = 0

    def apply_alert(self, alert: AlertRecord) -> AlertView:
        view = self.alerts.setdefault(alert.alert_id, AlertView(alert.alert_id))
        if alert.raised:
            view.raised = alert
        else:
            view.cleared = alert
        return view

    def apply_ack(self, ack: AlertState) -> AlertView:
        view = self.alerts.setdefault(ack.alert_id, AlertView(ack.alert_id))
        view.ack = ack
        return view

    def apply_silence(self, silence: Silence) -> None:
        self.silences[silence.silence_id] = silence

    def apply(self, message: Message, settings: Settings) -> str | None:
        """Fold one record of any of the three topics; returns the alert id it touched, if any.
        A record that does not decode is counted and logged (one line), never fatal."""
        topic = message.topic()
        try:
            if topic == settings.topics.alerts:
                return self.apply_alert(decode_alert(message.value())).alert_id
            if topic == settings.topics.alert_state:
                return self.apply_ack(decode_record(message.value(), AlertState)).alert_id
            if topic == settings.topics.silences:
                self.apply_silence(decode_record(message.value(), Silence))
        except (BadAlert, BadRecord) as exc:
            self.malformed += 1
            log.warning("skipping malformed record at %s[%d]@%d: %s", topic, message.partition(), message.offset(), exc)
        return None

    # -- staying bounded (the long-running services) ----------------------------------------

    def forget(self, now_ms: int, after_ms: int, keep: Callable[[AlertView], bool] = lambda _: False) -> list[str]:
        """Drop the alerts that ended more than ``after_ms`` ago (cleared; or only an operator
        step seen, no raise) unless ``keep`` wants them still, and the silences that expired
        that long ago; returns the alert ids dropped. Their records stay in Kafka."""
        cutoff = now_ms - after_ms
        gone = [
            alert_id
            for alert_id, view in self.alerts.items()
            if not view.firing and _ended_ms(view) <= cutoff and not keep(view)
        ]
        for alert_id in gone:
            del self.alerts[alert_id]
        for silence_id in [k for k, s in self.silences.items() if s.ends_at_ms <= cutoff]:
            del self.silences[silence_id]
        return gone

    # -- questions ------------------------------------------------------------------------

    def find(self, alert_id: str) -> AlertView:
        """The alert with this id or unique id prefix (at least :data:`MIN_PREFIX` characters)."""
        view = self.alerts.get(alert_id)
        if view is not None and (view.raised or view.cleared):
            return view
        if len(alert_id) >= MIN_PREFIX:
            matches = [v for k, v in self.alerts.items() if k.startswith(alert_id) and (v.raised or v.cleared)]
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                raise UnknownAlert(
                    f"alert id prefix {alert_id!r} is ambiguous ({len(matches)} alerts); give more of it"
                )
        if len(alert_id) < MIN_PREFIX:
            raise UnknownAlert(
                f"alert id {alert_id!r} is too short: give at least {MIN_PREFIX} characters of it "
                "(as `alerts list` shows them)"
            )
        raise UnknownAlert(f"no alert with id {alert_id!r} on the alert topic")

    def silence_for(self, alert: AlertRecord, now_ms: int) -> Silence | None:
        """The active silence that mutes ``alert`` now, if any."""
        return next((s for s in self.silences.values() if s.silences(alert, now_ms)), None)

    def select(
        self,
        *,
        open_only: bool = False,
        sites: Iterable[str] = (),
        min_severity: str | None = None,
    ) -> Iterator[AlertView]:
        """Known alerts (seen raised or cleared), open ones first, most severe first, newest first."""
        sites = frozenset(sites)
        views = [v for v in self.alerts.values() if v.raised is not None or v.cleared is not None]
        views.sort(key=lambda v: -(v.raised_ms or 0))
        views.sort(key=lambda v: (not v.firing, v.record.severity_rank))
        for view in views:
            record = view.record
            if open_only and not view.firing:
                continue
            if sites and record.site not in sites:
                continue
            if min_severity and record.severity_rank > severity_rank(min_severity):
                continue
            yield view


def load_book(settings: Settings, timeout_s: float = 60.0) -> AlertBook:
    """Fold the alert, alert-state and silence topics from their beginning to their end now."""
    follower = TopicFollower(settings.kafka, book_topics(settings))
    try:
        book = AlertBook()
        for message in follower.catch_up(timeout_s):
            book.apply(message, settings)
        return book
    finally:
        follower.close()


def book_topics(settings: Settings) -> list[str]:
    return [settings.topics.alerts, settings.topics.alert_state, settings.topics.silences]
