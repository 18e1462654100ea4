"""``iotwatch alerts forward``: notify receivers per a policy tree (``--routes FILE``), with
silences, grouping, repeats of unacknowledged critical alerts and resolved notifications, as
Alertmanager and Grafana decide (:func:`iotwatch.alerts.notify_policy.decide`); or post every
raised/cleared alert record to one webhook (``--webhook URL``, the tree of one ``record``
receiver: :mod:`iotwatch.alerts.feed`). docs/operate/oncall.md ("Notifications") describes
what it sends when, and its delivery guarantees.

State: the alerts, acknowledgements and silences are folded from their topics
(:mod:`iotwatch.alerts.book`); every group notification sent is recorded on the notifications
topic, which is all the forwarder needs to know what each receiver already has. On start it
replays the topics to their end before it sends anything, so a restart neither repeats what
was sent nor forgets a repeat timer. Memory stays bounded by what is open (:meth:`Dispatcher.forget`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from confluent_kafka import Message, Producer

from iotwatch.alerts.book import AlertBook, AlertView, book_topics
from iotwatch.alerts.feed import Pending, RecordFeed
from iotwatch.alerts.metrics import LifecycleMetrics
from iotwatch.alerts.notification import posts, record_body, record_key
from iotwatch.alerts.notify_policy import Due, GroupNow, decide
from iotwatch.alerts.routing import Route, RoutingTree
from iotwatch.alerts.webhook import Backoff, PostResult, Webhook
from iotwatch.clients.influx import InfluxV1Client
from iotwatch.clients.kafka import TopicFollower, client_config, ensure_topics, produce_confirmed, topic_partitions
from iotwatch.contract.alerts import AlertRecord, BadAlert, decode_alert
from iotwatch.contract.dead_letters import DeadLetter
from iotwatch.contract.oncall import (
    ONCALL_SCHEMA_VERSION,
    AlertStep,
    BadRecord,
    Notification,
    decode,
    encode,
    stable_id,
)
from iotwatch.errors import ServiceUnavailable
from iotwatch.settings import AlertsSettings, Settings

log = logging.getLogger(__name__)

GroupId = tuple[str, str]  # (receiver, group key)

#: Longest stretch a ``record`` receiver's backlog is posted before the topics are read again.
FEED_SLICE_S = 1.0
#: How often the start is tried again while Kafka does not answer.
START_RETRY_S = 2.0


@dataclass
class Group:
    """The alerts one route sends to one receiver under one group key."""

    route: Route
    alert_ids: set[str] = field(default_factory=set)
    pending_since_ms: int | None = None  # first firing alert not yet notified (group_wait runs from here)
    failures: int = 0  # failed posts of the notification now due
    retry_at_ms: int = 0  # ... not tried again before this (the other groups go on meanwhile)


@dataclass(frozen=True)
class ForwardOptions:
    """How a run starts and ends: the ``record`` receiver's consumer group and where a new group
    starts (the oldest retained alert, or the end of the topic), and the run's bounds."""

    group_id: str  # IOTWATCH_ALERTS_FORWARD_GROUP_ID unless --group
    from_beginning: bool = True
    limit: int | None = None  # stop after this many alert records were handled
    timeout_s: float | None = None


class Dispatcher:
    """Folds the on-call topics and sends what the policy tree says, when it says."""

    def __init__(
        self,
        settings: Settings,
        config: AlertsSettings,
        tree: RoutingTree,
        stop: threading.Event,
        clock: Callable[[], float] = time.time,
        options: ForwardOptions | None = None,
    ) -> None:
        self.settings, self.config, self.tree, self.stop, self.clock = settings, config, tree, stop, clock
        self.options = options or ForwardOptions(group_id=config.forward_group_id)
        self.book = AlertBook()
        self.groups: dict[GroupId, Group] = {}
        self.sent: dict[GroupId, Notification] = {}
        self.webhooks = {
            name: Webhook(r.url, {**config.webhook_headers, **r.headers}, r.timeout_s)
            for name, r in tree.receivers.items()
        }
        self.backoff = Backoff(config.retry_initial_s, config.retry_max_s)
        self.counts: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()  # failed posts by reason (http_503, timeout, ...)
        self.feed: RecordFeed | None = None  # the ``record`` receiver's backlog, once started
        self.deadline: float | None = None  # time.monotonic() at which the run ends (no post outlasts it)
        self._producer = Producer({**client_config(settings.kafka), "enable.idempotence": True})
        self._dead_path = config.state_dir / "dead-notifications.jsonl"
        self._closing: set[str] = set()  # acknowledged alerts that cleared, to record as such
        self.metrics = LifecycleMetrics(InfluxV1Client(settings.influx)) if settings.influx.enabled else None
        self._forgot_at = 0.0

    # -- the loop --------------------------------------------------------------------------

    def run(self, timeout_s: float | None = None, tick_s: float = 0.2) -> dict[str, Any]:
        """Replay the topics, then follow them and notify until ``stop``, ``timeout_s`` (or the
        options' timeout) or the options' ``limit``."""
        timeout_s = timeout_s if timeout_s is not None else self.options.timeout_s
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        follower = self._start()
        if follower is None:  # stopped (or timed out) while Kafka did not answer
            self._close()
            return self.result()
        try:
            for message in follower.catch_up():
                self.apply(message)
            topics = self.settings.topics
            log.info(
                "alerts forward: state rebuilt (%d alerts, %d silences, %d groups notified before); following %s "
                "on Kafka %s -> receivers %s; Ctrl-C or SIGTERM stops",
                len(self.book.alerts),
                len(self.book.silences),
                len(self.sent),
                topics.alerts,
                self.settings.kafka.bootstrap_servers,
                ", ".join(f"{name} ({hook.name})" for name, hook in sorted(self.webhooks.items())),
            )
            while not self.stop.is_set() and not self._past_deadline() and not self._limit_reached():
                for message in follower.poll(tick_s):
                    self.apply(message)
                self.evaluate()
                if self.metrics is not None:
                    self.metrics.flush(self.book, int(self.clock() * 1000))
        finally:
            follower.close()
            self._close()
        return self.result()

    def _start(self) -> TopicFollower | None:
        """Create the topics, find the ``record`` receiver's place and open the follower; while
        Kafka does not answer (restarting), try again every few seconds until a stop or the
        deadline (then None; with no deadline it waits)."""
        topics = self.settings.topics
        while True:
            try:
                ensure_topics(self.settings.kafka, [topics.alerts])
                ensure_topics(
                    self.settings.kafka, [topics.alert_state, topics.silences, topics.notifications], compacted=True
                )
                receiver = self.tree.record_receiver
                if receiver is not None and self.feed is None:
                    feed = RecordFeed(self.settings, receiver, self.options.group_id, self.options.from_beginning)
                    try:
                        partitions = topic_partitions(self.settings.kafka, [topics.alerts], "READ")[topics.alerts]
                        feed.begin(partitions)
                    except BaseException:
                        feed.close()
                        raise
                    self.feed = feed
                return TopicFollower(self.settings.kafka, [*book_topics(self.settings), topics.notifications])
            except ServiceUnavailable as exc:
                if self.deadline is not None and time.monotonic() + START_RETRY_S >= self.deadline:
                    log.warning("alerts forward: %s; the run's timeout ends it", exc)
                    return None
                log.warning("alerts forward: %s; retrying every %.0f s", exc, START_RETRY_S)
                if self.stop.wait(START_RETRY_S):
                    return None

    def _close(self) -> None:
        self._producer.flush(10)
        if self.feed is not None:
            self.feed.close()
        if self.metrics is not None:
            self.metrics.flush(self.book, int(self.clock() * 1000), force=True)
            self.metrics.client.close()

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _limit_reached(self) -> bool:
        """Handled: a record receiver's records delivered, dead-lettered or skipped as repeats;
        without one, the alert records folded."""
        skipped = self.feed.duplicates if self.feed is not None else 0
        return self.options.limit is not None and self.counts["handled"] + skipped >= self.options.limit

    def result(self) -> dict[str, Any]:
        """The run's counters (every one, zero or not) and failed posts by reason."""
        names = (
            "alert_records",
            "delivered",
            "sent_firing",
            "sent_resolved",
            "sent_repeat",
            "dead_lettered",
            "retries",
            "cleared_after_ack",
            "forgotten_alerts",
        )
        feed = self.feed
        return {
            **{name: self.counts[name] for name in names},
            "malformed": self.book.malformed,
            "duplicates": feed.duplicates if feed is not None else 0,
            "commit_failures": feed.commit_failures if feed is not None else 0,
            "waiting": feed.waiting() if feed is not None else 0,
            "failures": dict(self.failures),
        }

    def apply(self, message: Message) -> None:
        """Fold one record of any of the four topics."""
        topic = message.topic()
        if topic == self.settings.topics.notifications:
            try:
                record = decode(message.value(), Notification)
            except BadRecord as exc:
                self.book.malformed += 1
                log.warning("skipping malformed notification record at offset %d: %s", message.offset(), exc)
                return
            self.sent[(record.receiver, record.group_key)] = record
            return
        if topic != self.settings.topics.alerts:
            alert_id = self.book.apply(message, self.settings)
            if alert_id is not None:
                self._observe(alert_id)
            return
        self.counts["alert_records"] += 1
        try:
            alert: AlertRecord | None = decode_alert(message.value())
            detail = ""
        except BadAlert as exc:
            alert, detail = None, str(exc)
            self.book.malformed += 1
            log.warning("malformed record at %s[%d]@%d: %s", topic, message.partition(), message.offset(), exc)
        routes = self.tree.routes(alert) if alert is not None else []
        if self.feed is not None:
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None  # a consumed record has both
            pending = self.feed.pending(partition, offset, alert, message.value() or b"", message.key(), detail)
            routed = alert is None or any(r.receiver == self.feed.receiver for r in routes)
            self.feed.offer(pending, routed, alert is not None and self._seen(alert))
        else:
            self.counts["handled"] += 1
        if alert is None:
            return
        self.book.apply_alert(alert)
        self._observe(alert.alert_id)
        for route in routes:
            if route.receiver == self.tree.record_receiver:
                continue
            group = self.groups.setdefault((route.receiver, route.group_key(alert)), Group(route))
            group.alert_ids.add(alert.alert_id)

    def _seen(self, alert: AlertRecord) -> bool:
        """The book already holds this alert's raise (or clear): ``alert`` repeats it."""
        view = self.book.alerts.get(alert.alert_id)
        return view is not None and (view.raised if alert.raised else view.cleared) is not None

    def _observe(self, alert_id: str) -> None:
        if self.book.alerts[alert_id].needs_cleared_after_ack():
            self._closing.add(alert_id)
        if self.metrics is not None:
            self.metrics.observe(self.book.alerts[alert_id])

    # -- deciding --------------------------------------------------------------------------

    def evaluate(self) -> None:
        """Record acknowledged alerts that cleared; send every notification that is due now."""
        self._record_cleared_after_ack()
        for gid, group in list(self.groups.items()):
            if self.stop.is_set() or self._past_deadline():
                return
            self._evaluate(gid, group, int(self.clock() * 1000))
        self._post_records()
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
            self._send(gid, group, due, last, now)

    def _record_cleared_after_ack(self) -> None:
        """The ``cleared_after_ack`` step on the alert-state topic, carrying the acknowledgement
        (decided after the replay, so a step already recorded is not written again)."""
        for alert_id in sorted(self._closing):
            view = self.book.alerts[alert_id]
            ack, cleared = view.ack, view.cleared
            if ack is None or cleared is None or not view.needs_cleared_after_ack():
                continue
            step = msgspec.structs.replace(
                ack, v=ONCALL_SCHEMA_VERSION, action=AlertStep.CLEARED_AFTER_ACK, cleared_at_ms=cleared.detected_at_ms
            )
            produce_confirmed(
                self.settings.kafka, self._producer, self.settings.topics.alert_state, alert_id.encode(), encode(step)
            )
            self.book.apply_ack(step)
            self.counts["cleared_after_ack"] += 1
        self._closing.clear()

    # -- sending ---------------------------------------------------------------------------

    def _post(self, receiver: str, document: Any, key: str, attempt: int) -> PostResult:
        """One post, no longer than the run has left."""
        webhook = self.webhooks[receiver]
        timeout_s = None
        if self.deadline is not None:
            timeout_s = max(0.001, min(webhook.timeout_s, self.deadline - time.monotonic()))
        return webhook.send(document, key, attempt, timeout_s)

    def _retry_in(self, receiver: str, failures: int, result: PostResult) -> float:
        """Seconds until a failed post is tried again: the back-off, or the receiver's Retry-After."""
        wait_s = self.backoff.delay(failures)
        if result.retry_after_s is not None:
            wait_s = min(result.retry_after_s, self.config.retry_after_max_s)
        self.counts["retries"] += 1
        self.failures[result.reason] += 1
        log.warning(
            "receiver %s (%s): post failed (%s), retrying in %.2f s%s",
            receiver,
            self.webhooks[receiver].name,
            result.reason,
            wait_s,
            " (Retry-After)" if result.retry_after_s is not None else "",
        )
        return wait_s

    def _post_records(self) -> None:
        """Post the ``record`` receiver's backlog in order, one record at a time, for up to
        :data:`FEED_SLICE_S` (then the topics are read again); a failed post holds the
        backlog until its retry (the receiver is down for all of it)."""
        feed = self.feed
        if feed is None:
            return
        until = time.monotonic() + FEED_SLICE_S
        while not self.stop.is_set() and not self._past_deadline() and time.monotonic() < until:
            if self._limit_reached() or int(self.clock() * 1000) < feed.retry_at_ms:
                break
            pending = feed.head()
            if pending is None:
                feed.commit()  # records not routed here move the group on too
                break
            if not self._post_record(feed, pending):
                break

    def _post_record(self, feed: RecordFeed, pending: Pending) -> bool:
        """Deliver, dead-letter or skip the head; False when its post failed (retried later)."""
        alert = pending.alert
        if alert is None:
            self._dead_letter(feed.receiver, pending.where, None, "malformed", pending.detail, pending)
        else:
            result = self._post(feed.receiver, record_body(alert), record_key(alert), feed.failures + 1)
            if result.outcome == "retry":
                feed.failures += 1
                wait_s = self._retry_in(feed.receiver, feed.failures, result)
                feed.retry_at_ms = int(self.clock() * 1000) + int(wait_s * 1000)
                return False
            if result.outcome == "delivered":
                self.counts["delivered"] += 1
            else:
                self._dead_letter(
                    feed.receiver, record_key(alert), record_body(alert), result.reason, result.detail, pending
                )
        feed.done(pending)
        self.counts["handled"] += 1
        return True

    def _send(self, gid: GroupId, group: Group, due: Due, last: Notification | None, now: int) -> None:
        receiver, group_key = gid
        kind, firing, resolved, repeated = due.kind, due.firing, due.resolved, due.repeated
        views: dict[str, AlertView] = self.book.alerts
        key = stable_id(receiver, group_key, kind, firing, resolved, last.sent_at_ms if last else 0, length=32)
        sends = posts(
            receiver,
            self.tree.receivers[receiver],
            group.route,
            group_key,
            kind,
            [views[a] for a in firing],
            [views[a] for a in resolved],
            repeated,
            key,
            now,
        )
        delivered = True
        for document, post_key in sends:  # a receiver taking one event per alert gets several
            result = self._post(receiver, document, post_key, group.failures + 1)
            if result.outcome == "retry":  # not recorded: tried again later (the posts are idempotent)
                group.failures += 1
                group.retry_at_ms = now + int(self._retry_in(receiver, group.failures, result) * 1000)
                return
            if result.outcome != "delivered":
                delivered = False
                self._dead_letter(receiver, group_key, document, result.reason, result.detail)
        group.failures, group.retry_at_ms = 0, 0
        record = Notification(ONCALL_SCHEMA_VERSION, receiver, group_key, kind, now, firing, resolved, repeated)
        produce_confirmed(
            self.settings.kafka,
            self._producer,
            self.settings.topics.notifications,
            f"{receiver}|{group_key}".encode(),
            encode(record),
        )
        self.sent[gid] = record
        group.pending_since_ms = None
        self.counts[f"sent_{kind.value}"] += delivered
        log.info(
            "notified %s: %s %s (%d firing, %d resolved)", receiver, kind.value, group_key, len(firing), len(resolved)
        )

    def _dead_letter(
        self,
        receiver: str,
        group_key: str,
        document: Any,
        reason: str,
        detail: str,
        source: Pending | None = None,
    ) -> None:
        """A notification the receiver refused for good (4xx), or an alert record that does not
        decode: kept with the reason in the file (and the dead-letter topic if set), then moved
        on. ``source``: the alert-topic record it came from (a ``record`` receiver's)."""
        self.counts["dead_lettered"] += 1
        log.error(
            "receiver %s: %s for %s dead-lettered to %s: %s",
            receiver,
            reason,
            group_key,
            self._dead_path,
            detail[:200],
        )
        entry = {
            "dead_at_ms": int(self.clock() * 1000),
            "receiver": receiver,
            "group_key": group_key,
            "reason": reason,
            "detail": detail[:1000],
            "notification": document,
        }
        if source is not None:
            entry["alert_topic_offset"] = f"{self.settings.topics.alerts}[{source.where}]"
            if source.alert is None:
                entry["raw"] = source.raw.decode(errors="replace")
        self._dead_path.parent.mkdir(parents=True, exist_ok=True)
        with self._dead_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        topic = self.config.dead_letter_topic
        if topic:
            if source is not None and source.alert is None:
                original = source.raw  # the record as the alert topic holds it
            else:
                original = json.dumps(document, default=str).encode()
            dead = DeadLetter(reason, detail, "alerts-forward", original, source.key if source else group_key.encode())
            self._producer.produce(topic, original, key=dead.key, headers=list(dead.headers()))
            if self._producer.flush(10) > 0:
                log.error("dead-letter topic %s did not confirm within 10 s (the file has it)", topic)
