"""``iotwatch alerts forward``: post every raised/cleared alert to a webhook, at least once.

Webhook request (one per alert record with state ``raised`` or ``cleared``)::

    POST <webhook url>
    Content-Type: application/json
    Idempotency-Key: <alert_id>:<state>     same value on every retry and after restarts
    X-Iotwatch-Attempt: <n>                 1 for the first try of this process
    User-Agent: iotwatch-alerts-forward/1
    (plus IOTWATCH_ALERTS_WEBHOOK_HEADERS, e.g. Authorization)

    {"alert_id": "3f0c...", "state": "raised", "severity": "critical", "rule": "crash",
     "detector": "rule", "device_id": "car-1", "device_type": "vehicle_edr", "site": "fleet-2",
     "metric": "accel_long_g", "value": -6.2, "score": 1.0, "threshold": 4.0,
     "fire_score": 0.75, "clear_score": 0.45, "contributors": [{"metric": ..., "value": ..., "score": ...}],
     "first_event_ms": ..., "first_event_time": "...Z", "last_event_ms": ..., "last_event_time": "...Z",
     "occurrences": 1, "detected_at": "...Z", "detected_at_ms": ..., "model_version": "...",
     "message": "[CRITICAL] crash raised on vehicle_edr car-1 at fleet-2: ...",
     "text": ":red_circle: [CRITICAL] crash raised on vehicle_edr car-1 at fleet-2: ..."}

The body is the alert record exactly as published (every field of streaming.alerting, any
future field too) plus ``text``, so Slack/Mattermost incoming webhooks can take it as is.
``text`` starts with :red_circle: critical, :large_orange_circle: major,
:large_yellow_circle: minor, :large_blue_circle: warning, :large_green_circle: cleared.

Delivery: any 2xx is success. 408, 429, 5xx, timeouts and connection errors are retried
indefinitely (exponential back-off with jitter up to IOTWATCH_ALERTS_RETRY_MAX_S, or the
Retry-After header). Other 4xx (and 3xx) are final: logged, and the alert is appended with
the reason to <state_dir>/dead-letters.jsonl (and IOTWATCH_ALERTS_DEAD_LETTER_TOPIC if set).

While a receiver is down the consumer is paused and still polled, so it keeps its place in
the group (``max.poll.interval.ms``) however long the retries last. ``--timeout`` bounds the
whole run, retries and posts included.

Guarantees: the Kafka offset of an alert is committed only after it was delivered or
dead-lettered (manual commits, in order), and (alert_id, state) is remembered in
<state_dir>/delivered.sqlite first, so a restart neither loses an alert nor resends a
delivered one. The one repeat possible is an alert whose post succeeded just before a
crash, sent again with the same Idempotency-Key. SIGTERM/Ctrl-C: the post in flight is
finished and committed, then the process exits 0 (an alert still waiting for a retry is
left uncommitted and is sent by the next run).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from alerts.store import DeliveryStore
from alerts.tail import group_consumer
from alerts.webhook import Backoff, PostResult, Webhook, deliver
from iotwatch.clients.kafka import client_config
from iotwatch.contract.alerts import AlertRecord, BadAlert, alert_as_dict, decode_alert
from iotwatch.contract.dead_letters import DeadLetter
from iotwatch.errors import ServiceUnavailable
from iotwatch.settings import AlertsSettings, Settings

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 3600.0


class DeadLetters:
    """Undeliverable records with the reason: a JSON-lines file (fsynced) and optionally a topic."""

    def __init__(self, path: Path, settings: Settings, topic: str | None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.topic = path, topic
        self._producer = Producer({**client_config(settings.kafka), "enable.idempotence": True}) if topic else None

    def write(self, message: Message, alert: AlertRecord | None, reason: str, detail: str) -> None:
        raw = message.value() or b""
        entry = {
            "dead_at_ms": int(time.time() * 1000),
            "reason": reason,
            "detail": detail[:1000],
            "topic": message.topic(),
            "partition": message.partition(),
            "offset": message.offset(),
            "alert": alert_as_dict(alert) if alert is not None else None,
            "raw": None if alert is not None else raw.decode(errors="replace"),
        }
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        if self._producer is not None and self.topic:
            dead = DeadLetter(reason, detail, "alerts-forward", raw, message.key())
            self._producer.produce(self.topic, raw, key=message.key(), headers=dead.headers())
            if self._producer.flush(10) > 0:
                log.error("dead-letter topic %s did not confirm within 10 s (the file has it)", self.topic)


class PausedWhileWaiting:
    """The consumer while an alert waits for its receiver: paused and still polled, so it
    keeps its group membership (a consumer that does not poll for ``max.poll.interval.ms``
    is expelled). A record that arrives anyway (a partition assigned meanwhile) is sought
    back, to be read after the alert in hand."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.paused: list[TopicPartition] = []

    def poll(self) -> None:
        if not self.paused:
            self.paused = list(self.consumer.assignment())
            self.consumer.pause(self.paused)
        message = self.consumer.poll(0)
        if message is not None and message.error() is None:
            where = TopicPartition(message.topic(), message.partition(), message.offset())
            self.consumer.pause([where])
            self.consumer.seek(where)
            self.paused.append(where)

    def resume(self) -> None:
        if self.paused:
            self.consumer.resume(self.paused)
            self.paused = []


@dataclass
class ForwardOptions:
    group_id: str
    from_beginning: bool = True  # a new group starts at the oldest retained alert
    limit: int | None = None  # stop after this many records handled
    timeout_s: float | None = None


class Forwarder:
    """Consume the alert topic in a group, post each alert, commit each offset after the outcome is final."""

    def __init__(
        self,
        settings: Settings,
        alerts: AlertsSettings,
        webhook: Webhook,
        options: ForwardOptions,
        stop: threading.Event,
    ) -> None:
        self.settings, self.alerts, self.webhook, self.options, self.stop = settings, alerts, webhook, options, stop
        self.store = DeliveryStore(alerts.state_dir / "delivered.sqlite", webhook.url, alerts.dedupe_ttl_s)
        self.dead_letters = DeadLetters(alerts.state_dir / "dead-letters.jsonl", settings, alerts.dead_letter_topic)
        self.backoff = Backoff(alerts.retry_initial_s, alerts.retry_max_s)
        self.counts: Counter[str] = Counter()
        self.deadline: float | None = None  # time.monotonic() at which --timeout ends the run
        self.failures: Counter[str] = Counter()

    def run(self) -> dict[str, Any]:
        """Forward until ``stop``, ``limit`` or ``timeout_s``; returns the counters."""
        consumer = self._consumer()
        if consumer is None:  # stopped while Kafka was away
            self.store.close()
            return self._result()
        log.info(
            "alerts forward: %s on Kafka %s (group %s) -> webhook %s; Ctrl-C or SIGTERM stops",
            self.settings.topics.alerts,
            self.settings.kafka.bootstrap_servers,
            self.options.group_id,
            self.webhook.name,
        )
        deadline = time.monotonic() + self.options.timeout_s if self.options.timeout_s is not None else None
        self.deadline = deadline
        next_prune = 0.0
        try:
            while not self.stop.is_set():
                if self.options.limit is not None and self.counts["consumed"] >= self.options.limit:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                if time.monotonic() >= next_prune:
                    pruned = self.store.prune()
                    if pruned:
                        log.info(
                            "dedupe store: forgot %d deliveries older than %.0f s", pruned, self.alerts.dedupe_ttl_s
                        )
                    next_prune = time.monotonic() + PRUNE_EVERY_S
                message = consumer.poll(0.5)
                if message is None:
                    continue
                if message.error() is not None:
                    if message.error().code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                        log.warning("Kafka: %s", message.error())
                    continue
                self.counts["consumed"] += 1
                if self.handle(message, PausedWhileWaiting(consumer)):
                    self._commit(consumer, message)
                else:
                    self.counts["interrupted"] += 1  # left uncommitted: the next run sends it
                    break
        finally:
            consumer.close()  # nothing is auto-committed: only what _commit committed counts
            self.store.close()
        return self._result()

    def _consumer(self, retry_s: float = 2.0) -> Consumer | None:
        """The group's consumer, waiting for a Kafka that does not answer yet (restarting)
        until a stop (None) or ``timeout_s`` (then the error)."""
        started = time.monotonic()
        while True:
            try:
                return group_consumer(
                    self.settings, self.alerts, self.options.group_id, self.options.from_beginning, auto_commit=False
                )
            except ServiceUnavailable as exc:
                timeout_s = self.options.timeout_s
                if timeout_s is not None and time.monotonic() - started + retry_s >= timeout_s:
                    raise
                log.warning("alerts forward: %s; retrying every %.0f s", exc, retry_s)
                if self.stop.wait(retry_s):
                    return None

    def _result(self) -> dict[str, Any]:
        return {
            **{
                k: self.counts[k]
                for k in (
                    "consumed",
                    "delivered",
                    "duplicates",
                    "dead_lettered",
                    "retries",
                    "commit_failures",
                    "interrupted",
                )
            },
            "failures": dict(self.failures),
        }

    def handle(self, message: Message, paused: PausedWhileWaiting | None = None) -> bool:
        """Deliver, dead-letter or skip one record; False if interrupted (stop or ``--timeout``)
        before its outcome was final. ``paused`` keeps the consumer in its group during retries."""
        try:
            alert = decode_alert(message.value())
        except BadAlert as exc:
            log.error("malformed record at %s[%d]@%d: %s", message.topic(), message.partition(), message.offset(), exc)
            self.dead_letters.write(message, None, "malformed", str(exc))
            self.counts["dead_lettered"] += 1
            return True
        alert_id, state = alert.alert_id, str(alert.state)
        if self.store.outcome(alert_id, state) is not None:
            self.counts["duplicates"] += 1
            log.debug("already handled %s:%s", alert_id, state)
            return True
        try:
            result = deliver(
                self.webhook,
                alert,
                self.backoff,
                self.stop,
                self.alerts.retry_after_max_s,
                self._on_failure,
                deadline=self.deadline,
                idle=paused.poll if paused else None,
            )
        finally:
            if paused is not None:
                paused.resume()
        if result is None:
            return False
        if result.outcome == "delivered":
            self.store.record(alert_id, state, "delivered")
            self.counts["delivered"] += 1
            return True
        log.error(
            "webhook %s refused %s:%s (%s %s): dead-lettered",
            self.webhook.name,
            alert_id,
            state,
            result.reason,
            result.detail[:200],
        )
        self.dead_letters.write(message, alert, result.reason, result.detail)
        self.store.record(alert_id, state, "dead")
        self.counts["dead_lettered"] += 1
        return True

    def _on_failure(self, result: PostResult, wait_s: float) -> None:
        self.counts["retries"] += 1
        self.failures[result.reason] += 1
        log.warning(
            "webhook %s: post failed (%s), retrying in %.2f s%s",
            self.webhook.name,
            result.reason,
            wait_s,
            " (Retry-After)" if result.retry_after_s is not None else "",
        )

    def _commit(self, consumer: Any, message: Message) -> None:
        offset = TopicPartition(message.topic(), message.partition(), message.offset() + 1)
        try:
            consumer.commit(offsets=[offset], asynchronous=False)
        except KafkaException as exc:  # e.g. a rebalance took the partition: the dedupe store covers it
            self.counts["commit_failures"] += 1
            log.warning("commit of %s[%d]@%d failed: %s", message.topic(), message.partition(), message.offset(), exc)
