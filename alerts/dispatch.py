"""``iotwatch alerts forward --routes FILE``: notify receivers per a policy tree, with
silences, grouping, repeats of unacknowledged critical alerts and resolved notifications.

How it decides, per (receiver, group key) -- Alertmanager's and Grafana's model:

- an alert is *firing* while raised and not cleared, and not muted by an active silence;
- a group's first notification waits ``group_wait`` after its first firing alert (a burst
  becomes one notification listing all of it);
- later, at most one notification per ``group_interval``, sent when the group has new
  firing alerts or alerts that cleared since the last notification (these are listed as
  resolved);
- with nothing new, a group with *unacknowledged critical* alerts still firing is sent
  again after ``repeat_interval``; acknowledged ones do not repeat.

Memory stays bounded by what is open: cleared alerts whose resolution every receiver got,
expired silences and groups with nothing firing are dropped ``forget_after_s`` after they
ended (:meth:`Dispatcher.forget`); what is left is the open alerts and the recent groups.

State: the alerts, acknowledgements and silences are folded from their topics
(:mod:`alerts.book`); every notification sent is recorded on the notifications topic
(compacted by receiver and group), which is all the forwarder needs to know what each
receiver already has. On start it replays the four topics to their end before it sends
anything, so a restart neither repeats what was sent nor forgets a repeat timer.
Delivery is at least once: a failed post (5xx, 408, 429, timeout) is tried again after a
back-off (or Retry-After) while the other groups and receivers go on; a 4xx refusal is
dead-lettered (<state_dir>/dead-notifications.jsonl) and recorded as handled. A crash
between a post and its record repeats that post with the same ``Idempotency-Key``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message, Producer

from alerts.book import AlertBook, AlertView, book_topics, detected_ms
from alerts.metrics import LifecycleMetrics
from alerts.notification import body
from alerts.notify_policy import GroupNow, decide
from alerts.routing import Route, RoutingTree
from alerts.webhook import Backoff, PostResult, Webhook
from iotwatch.clients.influx import InfluxV1Client
from iotwatch.clients.kafka import TopicFollower, client_config, ensure_topics, produce_confirmed
from iotwatch.contract.oncall import (
    ONCALL_SCHEMA_VERSION,
    AlertState,
    AlertStep,
    BadRecord,
    Notification,
    NotificationKind,
    decode,
    encode,
    stable_id,
)
from iotwatch.settings import AlertsSettings, Settings

log = logging.getLogger(__name__)

GroupId = tuple[str, str]  # (receiver, group key)


@dataclass
class Group:
    """The alerts one route sends to one receiver under one group key."""

    route: Route
    alert_ids: set[str] = field(default_factory=set)
    pending_since_ms: int | None = None  # first firing alert not yet notified (group_wait runs from here)
    failures: int = 0  # failed posts of the notification now due
    retry_at_ms: int = 0  # ... not tried again before this (the other groups go on meanwhile)


class Dispatcher:
    """Folds the on-call topics and sends what the policy tree says, when it says."""

    def __init__(
        self,
        settings: Settings,
        config: AlertsSettings,
        tree: RoutingTree,
        stop: threading.Event,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.config, self.tree, self.stop, self.clock = settings, config, tree, stop, clock
        self.book = AlertBook()
        self.groups: dict[GroupId, Group] = {}
        self.sent: dict[GroupId, Notification] = {}
        self.webhooks = {
            name: Webhook(r.url, {**config.webhook_headers, **r.headers}, r.timeout_s)
            for name, r in tree.receivers.items()
        }
        self.backoff = Backoff(config.retry_initial_s, config.retry_max_s)
        self.counts: Counter[str] = Counter()
        self._producer = Producer({**client_config(settings.kafka), "enable.idempotence": True})
        self._dead_path = config.state_dir / "dead-notifications.jsonl"
        self._closing: set[str] = set()  # acknowledged alerts that cleared, to record as such
        self.metrics = LifecycleMetrics(InfluxV1Client(settings.influx)) if settings.influx.enabled else None
        self._forgot_at = 0.0

    # -- the loop --------------------------------------------------------------------------

    def run(self, timeout_s: float | None = None, tick_s: float = 0.2) -> dict[str, Any]:
        """Replay the topics, then follow them and notify until ``stop`` or ``timeout_s``."""
        topics = self.settings.topics
        ensure_topics(self.settings.kafka, [topics.alerts])
        ensure_topics(self.settings.kafka, [topics.alert_state, topics.silences, topics.notifications], compacted=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        follower = TopicFollower(self.settings.kafka, [*book_topics(self.settings), topics.notifications])
        try:
            for message in follower.catch_up():
                self.apply(message)
            log.info(
                "alerts forward: state rebuilt (%d alerts, %d silences, %d groups notified before); following %s "
                "on Kafka %s -> receivers %s; Ctrl-C or SIGTERM stops",
                len(self.book.alerts),
                len(self.book.silences),
                len(self.sent),
                topics.alerts,
                self.settings.kafka.bootstrap_servers,
                ", ".join(sorted(self.tree.receivers)),
            )
            while not self.stop.is_set() and (deadline is None or time.monotonic() < deadline):
                for message in follower.poll(tick_s):
                    self.apply(message)
                self.evaluate()
                if self.metrics is not None:
                    self.metrics.flush(self.book, int(self.clock() * 1000))
        finally:
            follower.close()
            self._producer.flush(10)
            if self.metrics is not None:
                self.metrics.flush(self.book, int(self.clock() * 1000), force=True)
                self.metrics.client.close()
        return {**dict(self.counts), "malformed": self.book.malformed}

    def apply(self, message: Message) -> None:
        """Fold one record of any of the four topics."""
        if message.topic() == self.settings.topics.notifications:
            try:
                record = decode(message.value(), Notification)
            except BadRecord as exc:
                self.book.malformed += 1
                log.warning("skipping malformed notification record at offset %d: %s", message.offset(), exc)
                return
            self.sent[(record.receiver, record.group_key)] = record
            return
        alert_id = self.book.apply(message, self.settings)
        if alert_id is not None and self.book.alerts[alert_id].needs_cleared_after_ack():
            self._closing.add(alert_id)
        if alert_id is not None and self.metrics is not None:
            self.metrics.observe(self.book.alerts[alert_id])
        if alert_id is not None and message.topic() == self.settings.topics.alerts:
            view = self.book.alerts[alert_id]
            for route in self.tree.routes(view.record):
                group = self.groups.setdefault((route.receiver, route.group_key(view.record)), Group(route))
                group.alert_ids.add(alert_id)

    # -- deciding --------------------------------------------------------------------------

    def evaluate(self) -> None:
        """Record acknowledged alerts that cleared; send every notification that is due now."""
        self._record_cleared_after_ack()
        for gid, group in list(self.groups.items()):
            if self.stop.is_set():
                return
            self._evaluate(gid, group, int(self.clock() * 1000))
        if self.clock() - self._forgot_at >= 5.0:
            self.forget(int(self.clock() * 1000))

    def forget(self, now: int) -> None:
        """Drop what no notification needs any more (see the module doc): cleared alerts no
        receiver still has as firing, then groups left without alerts whose last notification
        listed none firing (a new alert in such a group starts it afresh, as a restart would)."""
        self._forgot_at = self.clock()
        after_ms = int(self.config.forget_after_s * 1000)
        still_notified = {a for record in self.sent.values() for a in record.firing}
        gone = set(
            self.book.forget(
                now, after_ms, keep=lambda view: view.alert_id in still_notified or view.alert_id in self._closing
            )
        )
        for gid, group in list(self.groups.items()):
            group.alert_ids -= gone
            last = self.sent.get(gid)
            if not group.alert_ids and group.pending_since_ms is None and (last is None or not last.firing):
                del self.groups[gid]
        for gid in [
            gid
            for gid, last in self.sent.items()
            if gid not in self.groups and not last.firing and now - last.sent_at_ms > after_ms
        ]:
            del self.sent[gid]
        if self.metrics is not None and gone:
            self.metrics.forget(gone)
        if gone:
            self.counts["forgotten_alerts"] += len(gone)

    def _evaluate(self, gid: GroupId, group: Group, now: int) -> None:
        if now < group.retry_at_ms:
            return
        alerts = self.book.alerts
        firing = sorted(
            a for a in group.alert_ids if alerts[a].firing and self.book.silence_for(alerts[a].record, now) is None
        )
        last = self.sent.get(gid)
        notified = frozenset(last.firing) if last else frozenset()
        state = GroupNow(
            firing=firing,
            notified=notified,
            last_sent_ms=last.sent_at_ms if last is not None and last.firing else None,
            resolved=sorted(a for a in notified if alerts.get(a) is not None and alerts[a].cleared is not None),
            unacked_critical=[a for a in firing if alerts[a].record.severity == "critical" and not alerts[a].acked],
            pending_since_ms=group.pending_since_ms,
            now_ms=now,
        )
        due, group.pending_since_ms = decide(state, group.route)
        if due is not None:
            self._send(gid, group, due.kind, due.firing, due.resolved, due.repeated, last, now)

    def _record_cleared_after_ack(self) -> None:
        """The ``cleared_after_ack`` step on the alert-state topic, carrying the acknowledgement
        (decided after the replay, so a step already recorded is not written again)."""
        for alert_id in sorted(self._closing):
            view = self.book.alerts[alert_id]
            if not view.needs_cleared_after_ack():
                continue
            ack = view.ack
            step = AlertState(
                ONCALL_SCHEMA_VERSION,
                alert_id,
                AlertStep.CLEARED_AFTER_ACK,
                ack.by,
                ack.at_ms,  # type: ignore[union-attr]
                ack.note,
                detected_ms(view.cleared),
            )  # type: ignore[union-attr,arg-type]
            produce_confirmed(
                self.settings.kafka, self._producer, self.settings.topics.alert_state, alert_id.encode(), encode(step)
            )
            self.book.apply_ack(step)
            self.counts["cleared_after_ack"] += 1
        self._closing.clear()

    # -- sending ---------------------------------------------------------------------------

    def _send(
        self,
        gid: GroupId,
        group: Group,
        kind: NotificationKind,
        firing: list[str],
        resolved: list[str],
        repeated: list[str],
        last: Notification | None,
        now: int,
    ) -> None:
        receiver, group_key = gid
        views: dict[str, AlertView] = self.book.alerts
        document = body(
            receiver,
            self.tree.receivers[receiver].format,
            group.route,
            group_key,
            kind,
            [views[a] for a in firing],
            [views[a] for a in resolved],
            repeated,
        )
        key = stable_id(receiver, group_key, kind, firing, resolved, last.sent_at_ms if last else 0, length=32)
        result = self.webhooks[receiver].send(document, key, group.failures + 1)
        if result.outcome == "retry":  # not recorded: tried again later, other receivers are not held up
            group.failures += 1
            wait_s = self.backoff.delay(group.failures)
            if result.retry_after_s is not None:
                wait_s = min(result.retry_after_s, self.config.retry_after_max_s)
            group.retry_at_ms = now + int(wait_s * 1000)
            self.counts["retries"] += 1
            log.warning("notification to %s failed (%s), retrying in %.2f s", receiver, result.reason, wait_s)
            return
        group.failures, group.retry_at_ms = 0, 0
        if result.outcome != "delivered":
            self._dead_letter(receiver, group_key, document, result)
        record = Notification(ONCALL_SCHEMA_VERSION, receiver, group_key, kind, now, firing, resolved, repeated)
        self._record(record)
        self.sent[gid] = record
        group.pending_since_ms = None
        self.counts[f"sent_{kind.value}"] += result.outcome == "delivered"
        log.info(
            "notified %s: %s %s (%d firing, %d resolved)", receiver, kind.value, group_key, len(firing), len(resolved)
        )

    def _record(self, record: Notification) -> None:
        produce_confirmed(
            self.settings.kafka,
            self._producer,
            self.settings.topics.notifications,
            f"{record.receiver}|{record.group_key}".encode(),
            encode(record),
        )

    def _dead_letter(self, receiver: str, group_key: str, document: dict[str, Any], result: PostResult) -> None:
        """A receiver refused the notification for good (4xx): kept with the reason, then moved on."""
        self.counts["dead_lettered"] += 1
        log.error(
            "receiver %s refused a notification for %s (%s %s): dead-lettered to %s",
            receiver,
            group_key,
            result.reason,
            result.detail[:200],
            self._dead_path,
        )
        self._dead_path.parent.mkdir(parents=True, exist_ok=True)
        with self._dead_path.open("a", encoding="utf-8") as handle:
            handle.write(
                json.dumps(
                    {
                        "dead_at_ms": int(self.clock() * 1000),
                        "receiver": receiver,
                        "group_key": group_key,
                        "reason": result.reason,
                        "detail": result.detail[:1000],
                        "notification": document,
                    },
                    default=str,
                )
                + "\n"
            )
