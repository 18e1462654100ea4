"""``iotwatch respond``: firing alerts in, corrective commands out, every step audited.

docs/operate/oncall.md ("The responder") describes the command's lifecycle, retries and
escalation. At most one command is open per (device, policy). Command ids are hashes of alert,
policy and attempt, and the responder rebuilds its state from the alert and commands topics on
start, so a restart sends nothing twice. Memory stays bounded by what is open: see
:meth:`Responder.forget`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import msgspec
from confluent_kafka import Message, Producer

from iotwatch.alerts.book import AlertBook
from iotwatch.clients.influx import InfluxV1Client
from iotwatch.clients.kafka import TopicFollower, client_config, ensure_topics, produce_confirmed
from iotwatch.contract.alerts import AlertLifecycle, AlertRecord, alert_message
from iotwatch.contract.dead_letters import DeadLetter
from iotwatch.contract.device_commands import decode_command_reply
from iotwatch.contract.device_topics import TWIN_REPORTED_SUFFIX, parse_command_ack_topic
from iotwatch.contract.oncall import (
    ONCALL_SCHEMA_VERSION,
    BadRecord,
    CommandAudit,
    CommandOutcome,
    Emergency,
    decode,
    encode,
    stable_id,
)
from iotwatch.contract.telemetry import ContractViolation, DeviceTypeName, Name
from iotwatch.errors import ServiceUnavailable
from iotwatch.responder.command_policy import OPEN, CommandNow, Next, next_step
from iotwatch.responder.escalation import RULE as ESCALATION_RULE
from iotwatch.responder.escalation import escalation_id, escalation_record
from iotwatch.responder.issuer import CommandIssuer, Delivery, SiteDelivery, command_of
from iotwatch.responder.metrics import write_command
from iotwatch.responder.policy import CommandPolicy
from iotwatch.responder.twin_reports import reported_twin
from iotwatch.settings import Settings

log = logging.getLogger(__name__)

#: A reply can come before its command's audit record: an operator's ``devices set`` writes the
#: record to Kafka and then commands the device, which may answer (MQTT) before the responder
#: has read the record. Such a reply waits this long for it before it is dead-lettered.
EARLY_REPLY_GRACE_S = 5.0
_MAX_EARLY_REPLIES = 10_000


class Responder:
    def __init__(
        self,
        settings: Settings,
        policies: tuple[CommandPolicy, ...],
        stop: threading.Event,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.policies, self.stop, self.clock = settings, policies, stop, clock
        self.config = settings.respond
        self.book = AlertBook()
        self.audits: dict[str, CommandAudit] = {}
        self.latest: dict[tuple[str, str], CommandAudit] = {}  # (alert id, policy) -> its last attempt
        self.counts: Counter[str] = Counter()
        self._producer = Producer({**client_config(settings.kafka), "enable.idempotence": True})
        self.issuer: Delivery = (
            SiteDelivery(settings)
            if self.config.delivery == "sites"
            else CommandIssuer(settings.mqtt, self.config.client_id)
        )
        self.influx = InfluxV1Client(settings.influx) if settings.influx.enabled else None
        self._runbook = settings.stream.runbook_url(ESCALATION_RULE)
        self._cleared: set[str] = set()  # escalation alerts this process resolved (until the record comes back)
        self._unusable: set[str] = set()  # firing alerts whose record cannot address a device
        self.notified: set[str] = set()  # alerts an emergency record was written for
        #: replies to commands not known yet, with when to give up: (monotonic deadline, topic, payload)
        self._early: deque[tuple[float, str, bytes]] = deque(maxlen=_MAX_EARLY_REPLIES)
        self._forgot_at = 0.0
        #: Decision rounds done since the state was rebuilt from the topics: whoever needs to
        #: know that what this process knows has been acted on waits for the next one.
        self.rounds = 0

    # -- the loop --------------------------------------------------------------------------

    def run(self, timeout_s: float | None = None, tick_s: float = 0.2) -> dict[str, Any]:
        topics = self.settings.topics
        ensure_topics(self.settings.kafka, [topics.alerts, topics.dlq])
        ensure_topics(self.settings.kafka, [topics.commands, topics.device_twin, topics.emergencies], compacted=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        follower = TopicFollower(self.settings.kafka, [topics.alerts, topics.commands, topics.emergencies])
        try:
            for message in follower.catch_up():
                self.apply(message)
            self._connect()
            log.info(
                "respond: following %s on Kafka %s; commands to devices %s; policies %s; Ctrl-C or SIGTERM stops",
                topics.alerts,
                self.settings.kafka.bootstrap_servers,
                f"over MQTT {self.settings.mqtt.url}"
                if self.config.delivery == "mqtt"
                else f"through each site's relay (replies on {topics.site_replicas(topics.replies)})",
                ", ".join(f"{p.rule} -> {p.command or p.action}" for p in self.policies) or "none",
            )
            while not self.stop.is_set() and (deadline is None or time.monotonic() < deadline):
                for message in follower.poll(tick_s):
                    self.apply(message)
                self.handle_replies()
                self.evaluate()
                self.rounds += 1
        finally:
            follower.close()
            self.issuer.close()
            self._producer.flush(10)
            if self.influx is not None:
                self.influx.close()
        return dict(self.counts)

    def apply(self, message: Message) -> None:
        if message.topic() == self.settings.topics.emergencies:
            key = message.key()  # the alert id: this responder keys every emergency record by it
            if key is None:
                self.counts["malformed_emergency"] += 1
                log.warning("skipping an emergency record without its alert id at offset %s", message.offset())
            else:
                self.notified.add(key.decode(errors="replace"))
            return
        if message.topic() != self.settings.topics.commands:
            self.book.apply(message, self.settings)
            return
        try:
            audit = decode(message.value(), CommandAudit)
        except BadRecord as exc:
            self.counts["malformed_audit"] += 1
            log.warning("skipping malformed audit record at offset %d: %s", message.offset(), exc)
            return
        self._remember(audit)

    def _remember(self, audit: CommandAudit) -> None:
        """Keep the newest step of each command. The follower reads back this responder's own
        records after it acted on them, so an older step of a command must not replace a newer
        one (it would re-run the step: a second escalation, seen in CI)."""
        known = self.audits.get(audit.command_id)
        if known is not None and len(known.history) > len(audit.history):
            return
        self.audits[audit.command_id] = audit
        key = (audit.alert_id, audit.policy)
        if key not in self.latest or self.latest[key].attempt <= audit.attempt:
            self.latest[key] = audit

    # -- replies ---------------------------------------------------------------------------

    def handle_replies(self) -> None:
        early, self._early = self._early, deque(maxlen=_MAX_EARLY_REPLIES)
        now = time.monotonic()
        for deadline, topic, payload in early:
            self.handle_reply(topic, payload, wait_until=deadline if now < deadline else None)
        for topic, payload in self.issuer.replies():
            self.handle_reply(topic, payload, wait_until=time.monotonic() + EARLY_REPLY_GRACE_S)

    @property
    def waiting_replies(self) -> int:
        """Replies held for the audit record of their command (it is on its way, or never comes)."""
        return len(self._early)

    def handle_reply(self, topic: str, payload: bytes, wait_until: float | None = None) -> None:
        """Record a device's reply (or twin report); a reply to a command not known (yet) is kept
        until ``wait_until`` (monotonic) for its audit record, then dead-lettered."""
        if topic.endswith("/" + TWIN_REPORTED_SUFFIX):
            self.record_twin(topic, payload)
            return
        try:
            (_, _, device_id), reply = parse_command_ack_topic(topic), decode_command_reply(payload)
        except ContractViolation as exc:
            self._dead_letter(exc.reason, exc.detail, topic, payload)
            return
        audit = self.audits.get(reply.command_id)
        if audit is None and wait_until is not None:
            self._early.append((wait_until, topic, payload))
            return
        if audit is None or audit.device_id != device_id or reply.device_id != device_id:
            self._dead_letter(
                "unknown_command",
                f"reply for command {reply.command_id} of {reply.device_id}, "
                "which this responder did not send to that device",
                topic,
                payload,
            )
            return
        outcome = CommandOutcome(reply.status.value)  # a device's answers are outcomes of the same names
        if audit.status not in OPEN or (outcome == CommandOutcome.ACCEPTED and audit.status == outcome):
            self.counts["late_replies"] += 1  # e.g. a repeat after a timeout: recorded once, not acted on
            return
        self._publish(audit.with_step(outcome, reply.at_ms, reply.reason))
        self.counts[f"reply_{outcome.value}"] += 1

    def record_twin(self, topic: str, payload: bytes) -> None:
        """A device's reported twin properties, as the twin's ``reported`` side."""
        try:
            key, record = reported_twin(topic, payload)
        except ContractViolation as exc:
            self._dead_letter(exc.reason, exc.detail, topic, payload)
            return
        self._produce(self.settings.topics.device_twin, key, encode(record))
        self.counts["twin_reports"] += 1

    # -- deciding --------------------------------------------------------------------------

    def evaluate(self) -> None:
        now = int(self.clock() * 1000)
        timeout_ms = int(self.config.reply_timeout_s * 1000)
        open_keys = {(a.device_id, a.policy) for a in self.audits.values() if a.status in OPEN}
        recent_ms = now - int(self.config.forget_after_s * 1000)
        for view in list(self.book.alerts.values()):
            if view.raised is None or view.alert_id in self._unusable:
                continue
            if not view.firing:  # a crash alert may clear before the responder saw it firing: still an emergency
                if view.alert_id not in self.notified and view.raised.detected_at_ms >= recent_ms:
                    for policy in self.policies:
                        if (
                            policy.action == "emergency"
                            and policy.applies_to(view.raised)
                            and _addressable(view.raised)
                        ):
                            self._emergency(view.raised, policy, now)
                self._time_out_unanswered(view.alert_id, now, timeout_ms)
                continue
            alert = view.record
            if not _addressable(alert):
                self._unusable.add(view.alert_id)
                self.counts["alerts_without_device"] += 1
                log.error(
                    "alert %s names no device a command can be sent to (device_id, device_type, site, rule "
                    "as in the contract): no command",
                    view.alert_id,
                )
                continue
            for policy in self.policies:
                if not policy.applies_to(alert):
                    continue
                if policy.action == "emergency":
                    self._emergency(alert, policy, now)
                    continue
                last = self.latest.get((view.alert_id, policy.name))
                if last is None:
                    if (alert.device_id, policy.name) not in open_keys:
                        self._issue(alert, policy, 1, now)
                        open_keys.add((alert.device_id, policy.name))
                    continue
                timed_out, step = next_step(CommandNow.of(last, now), timeout_ms, self.config.max_attempts)
                if timed_out:
                    last = self._publish(last.with_step(CommandOutcome.TIMED_OUT, now, "no final reply in time"))
                if step is Next.RETRY:
                    self._issue(alert, policy, last.attempt + 1, now)
                elif step is Next.ESCALATE:
                    self._escalate(alert, last, now)
        self._clear_escalations(now)
        if self.clock() - self._forgot_at >= 5.0:
            self.forget(now)

    def _time_out_unanswered(self, alert_id: str, now: int, timeout_ms: int) -> None:
        """Settle the open commands of a cleared alert as a firing one's are (``timed_out``
        once unanswered past expiry and reply timeout), without a retry: nothing needs
        correcting any more, and a command left ``sent`` would read as in flight forever."""
        for policy in self.policies:
            last = self.latest.get((alert_id, policy.name))
            if last is None or last.status not in OPEN:
                continue
            if next_step(CommandNow.of(last, now), timeout_ms, self.config.max_attempts)[0]:
                self._publish(last.with_step(CommandOutcome.TIMED_OUT, now, "no final reply in time (alert cleared)"))

    def forget(self, now: int) -> None:
        """Drop cleared alerts whose commands are settled (final, or unanswered past expiry and
        reply timeout; an escalation once its own alert cleared), with those commands and marks;
        and settled commands of no alert (an operator's) that ended ``forget_after_s`` ago."""
        self._forgot_at = self.clock()
        after_ms = int(self.config.forget_after_s * 1000)
        timeout_ms = int(self.config.reply_timeout_s * 1000)

        def settled(audit: CommandAudit) -> bool:
            if audit.status == CommandOutcome.ESCALATED:
                return not self._escalation_firing(audit)
            return audit.status not in OPEN or now >= audit.expires_at_ms + timeout_ms

        busy = {a.alert_id for a in self.latest.values() if not settled(a)}
        gone = set(self.book.forget(now, after_ms, keep=lambda view: view.alert_id in busy))
        cutoff = now - after_ms
        for command_id in [
            c
            for c, a in self.audits.items()
            if a.alert_id in gone or (a.alert_id not in self.book.alerts and settled(a) and _ended_ms(a) <= cutoff)
        ]:
            del self.audits[command_id]
        self.latest = {k: a for k, a in self.latest.items() if a.command_id in self.audits}
        self.notified -= gone
        self._unusable -= gone
        self._cleared -= gone
        if gone:
            self.counts["forgotten_alerts"] += len(gone)

    def _escalation_firing(self, audit: CommandAudit) -> bool:
        view = self.book.alerts.get(escalation_id(audit.alert_id, audit.policy))
        return view is not None and view.firing and view.alert_id not in self._cleared

    def _escalate(self, alert: AlertRecord, last: CommandAudit, now: int) -> None:
        """The command's attempts are used up and the condition persists: tell on-call."""
        why = (
            "the condition did not clear after the command"
            if last.status == CommandOutcome.DONE
            else f"attempt {last.attempt} {last.status.value}"
        )
        escalated = self._publish(last.with_step(CommandOutcome.ESCALATED, now, why))
        self._publish_alert(escalation_record(alert, escalated, AlertLifecycle.RAISED, why, now, self._runbook))
        self.counts["escalated"] += 1
        log.error(
            "escalate to on-call: %s on %s at %s still firing, %s (alert %s)",
            alert.rule,
            alert.device_id,
            alert.site,
            why,
            alert.alert_id,
        )

    def _clear_escalations(self, now: int) -> None:
        """Resolve the escalation alerts whose original alert cleared."""
        for audit in list(self.latest.values()):
            if audit.status != CommandOutcome.ESCALATED:
                continue
            original = self.book.alerts.get(audit.alert_id)
            escalation = self.book.alerts.get(escalation_id(audit.alert_id, audit.policy))
            if (
                original is None
                or original.cleared is None
                or escalation is None
                or not escalation.firing
                or escalation.alert_id in self._cleared
            ):
                continue
            self._publish_alert(
                escalation_record(original.record, audit, AlertLifecycle.CLEARED, "", now, self._runbook)
            )
            self._cleared.add(escalation.alert_id)

    def _emergency(self, alert: AlertRecord, policy: CommandPolicy, now: int) -> None:
        """One emergency notification record per alert (a restart finds it on the topic)."""
        if alert.alert_id in self.notified:
            return
        location = alert.location
        record = Emergency(
            ONCALL_SCHEMA_VERSION,
            alert.alert_id,
            policy.name,
            alert.rule,
            alert.device_id,
            alert.device_type,
            alert.site,
            alert.detected_at_ms,
            now,
            self.config.issuer,
            alert.message or alert.rule,
            location,
        )
        self._produce(self.settings.topics.emergencies, alert.alert_id.encode(), encode(record))
        self.notified.add(alert.alert_id)
        self.counts["emergencies"] += 1
        log.error(
            "emergency notification: %s on %s at %s (alert %s)",
            alert.rule,
            alert.device_id,
            alert.site,
            alert.alert_id,
        )

    def _issue(self, alert: AlertRecord, policy: CommandPolicy, attempt: int, now: int) -> None:
        ttl_ms = int((policy.ttl or self.config.command_ttl_s) * 1000)
        command_id = stable_id(alert.alert_id, policy.name, attempt, length=24)
        reason = f"alert {alert.alert_id} ({alert.rule})"
        audit = CommandAudit(
            ONCALL_SCHEMA_VERSION,
            command_id,
            policy.name,
            alert.alert_id,
            alert.rule,
            alert.device_id,
            alert.device_type,
            alert.site,
            policy.command,
            self.config.issuer,
            now,
            now + ttl_ms,
            attempt,
            CommandOutcome.SENT,
            policy.args,
        ).with_step(CommandOutcome.SENT, now, reason)
        command = command_of(audit)
        # Broker away (restarting): no command and no audit; the alert is evaluated again next tick.
        if not self.issuer.connected():
            self.counts["commands_deferred_while_disconnected"] += 1
            log.debug("%s to %s deferred: the MQTT session is reconnecting", policy.command, alert.device_id)
            return
        try:
            self.issuer.send(alert.site, alert.device_type, command)
        except ServiceUnavailable as exc:
            self.counts["send_failures"] += 1
            log.warning("%s to %s not sent: %s", policy.command, alert.device_id, exc)
            return
        self._publish(audit)  # with sites: the command itself, for the device's site to deliver
        self.counts["commands_sent"] += 1
        log.info("sent %s to %s (attempt %d) for %s", policy.command, alert.device_id, attempt, reason)

    def _connect(self, retry_s: float = 2.0) -> None:
        """Connect the MQTT session, waiting for a broker that is not up yet (restarting):
        a stop ends the wait."""
        while True:
            try:
                self.issuer.connect()
                return
            except ServiceUnavailable as exc:
                log.warning("respond: %s; retrying every %.0f s", exc, retry_s)
                if self.stop.wait(retry_s):
                    return

    # -- records ---------------------------------------------------------------------------

    def _publish(self, audit: CommandAudit) -> CommandAudit:
        self._produce(self.settings.topics.commands, audit.command_id.encode(), encode(audit))
        self._remember(audit)
        if self.influx is not None and not write_command(self.influx, audit):
            self.counts["influx_write_failures"] += 1
        return audit

    def _publish_alert(self, record: AlertRecord) -> None:
        """An alert record on the alert topic, as the streaming job writes them (key device id)."""
        self._produce(self.settings.topics.alerts, *alert_message(record))

    def _dead_letter(self, reason: str, detail: str, topic: str, payload: bytes) -> None:
        self.counts["dead_lettered"] += 1
        log.error("dead-lettered a command reply on %s: %s: %s", topic, reason, detail[:200])
        dead = DeadLetter(reason, detail, "responder", payload, topic.encode(), mqtt_topic=topic)
        self._produce(self.settings.topics.dlq, topic.encode(), payload, dead.headers())

    def _produce(self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]] | None = None) -> None:
        produce_confirmed(self.settings.kafka, self._producer, topic, key, value, headers)


def _addressable(alert: AlertRecord) -> bool:
    """Whether the alert's identity fields are contract names (a command topic can be built from them)."""
    try:
        for name in (alert.device_id, alert.site, alert.rule):
            msgspec.convert(name, Name)
        msgspec.convert(alert.device_type, DeviceTypeName)
    except msgspec.ValidationError:
        return False
    return True


def _ended_ms(audit: CommandAudit) -> int:
    return audit.history[-1].at_ms if audit.history else audit.issued_at_ms
