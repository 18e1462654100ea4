"""What an operator does to alerts: acknowledge them, silence and unsilence them.

Each action is one record produced to its compacted topic (:mod:`iotwatch.contract.oncall`) after
checking it against the folded state (:mod:`iotwatch.alerts.book`), so a typo in an alert id is a
one-line error, not a record about an alert that never existed.
"""

from __future__ import annotations

import time

import msgspec
from confluent_kafka import Producer

from iotwatch.alerts.book import AlertBook, AlertView, UnknownAlert
from iotwatch.clients.kafka import client_config, ensure_topics, produce_confirmed
from iotwatch.contract.oncall import ONCALL_SCHEMA_VERSION, AlertState, AlertStep, Matchers, Silence, encode, stable_id
from iotwatch.errors import IotwatchError
from iotwatch.settings import Settings


def publish(settings: Settings, topic: str, key: str, value: bytes) -> None:
    """Produce one record and wait until the broker confirmed it (idempotent producer)."""
    ensure_topics(settings.kafka, [topic], compacted=True)
    produce_confirmed(
        settings.kafka,
        Producer({**client_config(settings.kafka), "enable.idempotence": True}),
        topic,
        key.encode(),
        value,
    )


def acknowledge(
    settings: Settings,
    book: AlertBook,
    alert_id: str,
    by: str,
    note: str | None = None,
    now_ms: int | None = None,
    *,
    action: AlertStep = AlertStep.ACKNOWLEDGED,
) -> AlertView:
    """Record that ``by`` acknowledged the open alert ``alert_id`` (or a unique prefix of it);
    ``action=UNACKNOWLEDGED`` takes an acknowledgement back (the forwarder repeats it again)."""
    view = book.find(alert_id)
    if view.cleared is not None:
        raise IotwatchError(f"alert {view.alert_id} already cleared; it cannot be {action.value} any more")
    if action == AlertStep.ACKNOWLEDGED and view.acknowledgement is not None:
        raise IotwatchError(f"alert {view.alert_id} was already acknowledged by {view.acknowledgement.by}")
    if action == AlertStep.UNACKNOWLEDGED and not view.acked:
        raise IotwatchError(f"alert {view.alert_id} is not acknowledged")
    ack = AlertState(
        ONCALL_SCHEMA_VERSION,
        view.alert_id,
        action,
        by,
        now_ms if now_ms is not None else int(time.time() * 1000),
        note,
    )
    publish(settings, settings.topics.alert_state, view.alert_id, encode(ack))
    return book.apply_ack(ack)


def add_silence(
    settings: Settings,
    matchers: Matchers,
    duration_s: float,
    by: str,
    comment: str | None = None,
    now_ms: int | None = None,
) -> Silence:
    """Silence alerts matching ``matchers`` for ``duration_s`` from now."""
    if not matchers.describe():
        raise IotwatchError("a silence needs at least one of --site, --device, --rule, --severity")
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    silence = Silence(
        ONCALL_SCHEMA_VERSION,
        stable_id(matchers.describe(), now, by),
        matchers,
        now,
        now + int(duration_s * 1000),
        by,
        comment,
    )
    publish(settings, settings.topics.silences, silence.silence_id, encode(silence))
    return silence


def revoke_silence(settings: Settings, book: AlertBook, silence_id: str, by: str, now_ms: int | None = None) -> Silence:
    """End an active silence now (the record is rewritten with the new end and who ended it)."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    silence = book.silences.get(silence_id)
    if silence is None:
        raise UnknownAlert(f"no silence with id {silence_id!r}")
    if silence.ends_at_ms <= now:
        raise IotwatchError(f"silence {silence_id} is not active (it ended or was revoked)")
    ended = msgspec.structs.replace(silence, v=ONCALL_SCHEMA_VERSION, ends_at_ms=now, revoked_by=by)
    publish(settings, settings.topics.silences, ended.silence_id, encode(ended))
    book.apply_silence(ended)
    return ended
