"""``iotwatch relay``: a site's end of the centre's device commands.

docs/sites.md describes what it publishes, forwards and records. Delivery is at least once and
idempotent: on start the relay reads the commands replica from its beginning and publishes
again every command whose newest record there is still ``sent``; a device answers a command it
has seen again without running it again (``iotwatch.devices.commands``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import Message, Producer

from iotwatch.clients.kafka import TopicFollower, client_config, ensure_topics, list_topics, produce_confirmed
from iotwatch.clients.mqtt import PersistentSession
from iotwatch.contract.dead_letters import DeadLetter
from iotwatch.contract.device_commands import encode as encode_command
from iotwatch.contract.device_topics import COMMAND_ACK_SUFFIX, TWIN_REPORTED_SUFFIX, command_topic
from iotwatch.contract.oncall import BadRecord, CommandAudit, CommandOutcome, decode, encode
from iotwatch.contract.telemetry import ContractViolation
from iotwatch.errors import ServiceUnavailable
from iotwatch.responder.issuer import REPLY_FILTER, TWIN_FILTER, command_of
from iotwatch.responder.twin_reports import reported_twin
from iotwatch.settings import Settings

log = logging.getLogger(__name__)


class SiteRelay:
    """One site's relay: the replica of the commands topic to its devices, their replies and
    twin reports to the site's Kafka."""

    def __init__(self, settings: Settings, stop: threading.Event, clock: Callable[[], float] = time.time) -> None:
        self.settings, self.stop, self.clock = settings, stop, clock
        # a device with a retained online/offline status on this broker is at this site
        self.session = PersistentSession(
            settings.mqtt,
            settings.respond.relay_client_id,
            [settings.topics.mqtt_status_filter, TWIN_FILTER, REPLY_FILTER],
        )
        self._producer = Producer({**client_config(settings.kafka), "enable.idempotence": True})
        #: devices seen on this site's broker
        self.here: set[str] = set()
        #: commands to publish: command id -> its ``sent`` record
        self.waiting: dict[str, CommandAudit] = {}
        #: commands published by this process: command id -> expiry (epoch ms), forgotten after it
        self.published: dict[str, int] = {}
        #: what the devices sent, not written to Kafka yet: (MQTT topic, payload)
        self._inbox: deque[tuple[str, bytes]] = deque()
        self.counts: Counter[str] = Counter()

    def run(self, timeout_s: float | None = None, tick_s: float = 0.2) -> dict[str, Any]:
        topics = self.settings.topics
        ensure_topics(self.settings.kafka, [topics.replies, topics.dlq])
        ensure_topics(self.settings.kafka, [topics.device_twin], compacted=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if not self._wait_for_replica(deadline) or not self._connect(deadline):
            return dict(self.counts)
        follower = TopicFollower(self.settings.kafka, [topics.commands_replica])
        try:
            for message in follower.catch_up():
                self.apply(message)
            log.info(
                "relay: commands from %s on Kafka %s to devices on MQTT %s; their replies to %s; "
                "Ctrl-C or SIGTERM stops",
                topics.commands_replica,
                self.settings.kafka.bootstrap_servers,
                self.settings.mqtt.url,
                topics.replies,
            )
            while not self.stop.is_set() and (deadline is None or time.monotonic() < deadline):
                for message in follower.poll(tick_s):
                    self.apply(message)
                self.take_from_devices()
                self.deliver()
        finally:
            follower.close()
            self.session.close()
            self._producer.flush(10)
        self.counts["waiting_at_stop"] = len(self.waiting)
        return dict(self.counts)

    def _wait_for_replica(self, deadline: float | None) -> bool:
        """Until MirrorMaker has created the replica of the commands topic here (a relay may start
        before the site's link): a stop or the deadline ends the wait."""
        name = self.settings.topics.commands_replica
        while name not in list_topics(self.settings.kafka):
            log.info("relay: waiting for %s (MirrorMaker 2 creates it from the centre's commands topic)", name)
            if self.stop.wait(2.0) or (deadline is not None and time.monotonic() > deadline):
                return False
        return True

    def _connect(self, deadline: float | None, retry_s: float = 2.0) -> bool:
        """Connect the MQTT session, waiting for a broker that is not up yet."""
        while True:
            try:
                self.session.connect()
                return True
            except ServiceUnavailable as exc:
                log.warning("relay: %s; retrying every %.0f s", exc, retry_s)
                if self.stop.wait(retry_s) or (deadline is not None and time.monotonic() > deadline):
                    return False

    # -- commands from the centre ----------------------------------------------------------

    def apply(self, message: Message) -> None:
        """A record of the replica: a ``sent`` command waits to be published; any later step
        (answered, timed out, escalated) means there is nothing left to publish."""
        try:
            audit = decode(message.value(), CommandAudit)
        except BadRecord as exc:
            self.counts["malformed_audit"] += 1
            log.warning("relay: skipping a malformed audit record at offset %d: %s", message.offset(), exc)
            return
        if audit.status == CommandOutcome.SENT:
            if audit.command_id not in self.published:
                self.waiting[audit.command_id] = audit
        elif self.waiting.pop(audit.command_id, None) is not None:
            self.counts["settled_before_publishing"] += 1

    def deliver(self) -> None:
        """Publish the waiting commands of this site's devices; drop those that expired."""
        now = int(self.clock() * 1000)
        for command_id, audit in list(self.waiting.items()):
            if now >= audit.expires_at_ms:
                del self.waiting[command_id]
                self.counts["expired_here" if audit.device_id in self.here else "not_at_this_site"] += 1
                continue
            if audit.device_id not in self.here:
                continue
            command = command_of(audit)
            try:
                self.session.publish(
                    command_topic(audit.site, audit.device_type, audit.device_id), encode_command(command)
                )
            except ServiceUnavailable as exc:
                self.counts["publish_failures"] += 1
                log.warning("relay: %s to %s not published yet: %s", audit.name, audit.device_id, exc)
                return  # the broker is away: the rest waits for the next tick too
            del self.waiting[command_id]
            self.published[command_id] = audit.expires_at_ms
            self.counts["commands_published"] += 1
            log.info("relay: published %s to %s (command %s)", audit.name, audit.device_id, command_id)
        self.published = {c: expiry for c, expiry in self.published.items() if expiry > now}

    # -- replies and twin reports from the devices -----------------------------------------

    def take_from_devices(self) -> None:
        """What the site's devices sent since the last tick: replies to the replies topic,
        twin reports to the twin topic, and every device heard from is known to be here. With
        the site's Kafka away, what is not written yet stays for the next tick, in order."""
        while not self.session.received.empty():
            self._inbox.append(self.session.received.get_nowait())
        while self._inbox:
            topic, payload = self._inbox[0]
            parts = topic.split("/")
            if len(parts) >= 5 and parts[0] == "iot" and parts[3]:
                self.here.add(parts[3])  # iot/<site>/<device_type>/<device_id>/...
            try:
                if topic.endswith("/" + COMMAND_ACK_SUFFIX):
                    # as it came: the central responder validates it (and dead-letters what breaks the contract)
                    self._produce(self.settings.topics.replies, topic.encode(), payload)
                    self.counts["replies_forwarded"] += 1
                elif topic.endswith("/" + TWIN_REPORTED_SUFFIX):
                    self._record_twin(topic, payload)
            except ServiceUnavailable as exc:
                log.warning("relay: %s; trying again", exc)
                return
            self._inbox.popleft()

    def _record_twin(self, topic: str, payload: bytes) -> None:
        try:
            key, record = reported_twin(topic, payload)
        except ContractViolation as exc:
            self.counts["dead_lettered"] += 1
            log.error("relay: dead-lettered a twin report on %s: %s: %s", topic, exc.reason, exc.detail[:200])
            dead = DeadLetter(exc.reason, exc.detail, "relay", payload, topic.encode(), mqtt_topic=topic)
            self._produce(self.settings.topics.dlq, topic.encode(), payload, dead.headers())
            return
        self._produce(self.settings.topics.device_twin, key, encode(record))
        self.counts["twin_reports"] += 1

    def _produce(self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]] | None = None) -> None:
        produce_confirmed(self.settings.kafka, self._producer, topic, key, value, headers)
