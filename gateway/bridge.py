"""The bridge: MQTT in, Kafka out, nothing acknowledged before Kafka has it (the delivery report of
the reading or its dead letter): a crash costs a redelivery, never a gap (docs/operate/gateway.md)."""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from typing import Any, NamedTuple

import msgspec
import paho.mqtt.client as paho
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from iotwatch.clients.influx import InfluxV1Client, OutageLog
from iotwatch.clients.kafka import client_config, tls_refused
from iotwatch.clients.mqtt import BufferedReadClient, make_client
from iotwatch.contract.dead_letters import H_GATEWAY, H_INGEST_MS, H_MQTT_QOS, H_MQTT_TOPIC, DeadLetter, excerpt
from iotwatch.contract.device_topics import parse_device_topic
from iotwatch.contract.metric_catalog import KNOWN_METRICS
from iotwatch.contract.telemetry import ContractViolation, decode_telemetry
from iotwatch.errors import IotwatchError, ServiceUnavailable
from iotwatch.gateway.mapping import CompiledRule, Router, RoutingError
from iotwatch.gateway.metrics import GatewayStats, MetricsServer, influx_points, status_line
from iotwatch.heap import freeze_startup_heap
from iotwatch.settings import Settings

log = logging.getLogger(__name__)

_KAFKA_DOWN_ERRORS = {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE}
#: Kafka refuses the record itself (not the moment): producing it again can never succeed.
#: (A topic that does not exist yet is not one of these: the gateway waits for it.)
_REFUSED_ERRORS = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.INVALID_MSG,
    KafkaError.INVALID_MSG_SIZE,
    KafkaError.INVALID_RECORD,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError._INVALID_ARG,
    KafkaError._BAD_MSG,
}
_QOS_BYTES = (b"0", b"1", b"2")


#: Record headers as the producer types them (ours are all bytes).
KafkaHeaders = list[tuple[str, str | bytes | None]]


class _Pending(NamedTuple):
    """A received MQTT message whose Kafka record is not confirmed yet."""

    mid: int
    qos: int
    generation: int
    received_at: float
    topic: str
    key: bytes | None
    value: bytes
    headers: KafkaHeaders
    reason: str | None  # the dead-letter reason, None for a forwarded reading
    mqtt_topic: str


class Gateway:
    """One gateway instance. ``start()``, then ``stop()`` (drains in-flight messages)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.config = settings.gateway
        self.instance = self.config.client_id
        self.router = self.router_for(settings)
        self.stats = GatewayStats()
        self._pending: dict[int, _Pending] = {}
        self._acks: list[int] = []  # QoS 1 packet ids confirmed by Kafka, not yet acknowledged
        self._ids = itertools.count()
        self._last_seq: dict[str, int] = {}  # device -> last seq, least recently seen first
        self._generation = 0
        self._last_delivery_at = time.monotonic()
        self._kafka_back_at = 0.0  # when Kafka was last found down, or answered again after that
        self._newest_event_ms = 0  # newest event time received since the gauges' last refresh
        self._newest_seen_ms = 0  # newest event time at the gauges' last refresh that had one
        self._open = False  # accepting messages (read on the hot path: a plain attribute)
        self._instance_bytes = self.instance.encode()
        self._stopped = threading.Event()
        self._recreate_producer = threading.Event()
        self._subscribed = threading.Event()
        self._producer = self._make_producer()
        self._mqtt = self._make_mqtt()
        self._poller = threading.Thread(target=self._poll_kafka, name="gateway-kafka-poll", daemon=True)
        self._kafka_checker = threading.Thread(target=self._check_kafka, name="gateway-kafka-check", daemon=True)
        self._disconnecting = False  # a clean stop: the MQTT disconnect is ours, not a lost connection
        self._metrics_server: MetricsServer | None = None
        self._influx = InfluxV1Client(settings.influx) if settings.influx.enabled else None
        self._influx_outage = OutageLog(log, "gateway metrics")

    # -- set-up -------------------------------------------------------------------------

    @staticmethod
    def router_for(settings: Settings) -> Router:
        return Router(settings.gateway.rules, settings.topics)

    def _make_producer(self) -> Producer:
        return Producer(
            {
                **client_config(self.settings.kafka),
                "client.id": self.instance,
                "enable.idempotence": True,
                "acks": "all",
                "message.timeout.ms": 0,  # retry until delivered: an outage delays, never drops
                "linger.ms": self.config.linger_ms,
                "batch.num.messages": 10_000,
                "queue.buffering.max.messages": max(100_000, 4 * self.config.max_inflight),
                "compression.type": "lz4",
                "error_cb": self._on_kafka_error,
                # The gateway says itself when Kafka is lost (error_cb) and when it answers (its
                # metadata check), with what it holds meanwhile: librdkafka's own connection lines
                # would say each twice. Its errors still come through error_cb.
                "log_level": 2,
            }
        )

    def _make_mqtt(self) -> BufferedReadClient:
        client = make_client(
            self.settings.mqtt,
            self.instance,
            clean_session=False,
            manual_ack=True,
            protocol=self.config.mqtt_protocol,
            buffered_reads=True,
        )
        assert isinstance(client, BufferedReadClient)  # acks go out together (ack_many)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = lambda *_args: self._subscribed.set()
        client.reconnect_delay_set(min_delay=1, max_delay=10)
        return client

    def start(self, wait_subscribed_s: float = 15.0) -> None:
        """Connect to both sides, start serving metrics; returns once subscribed."""
        freeze_startup_heap()  # before the first message: no full collection pauses the hot path
        if self.config.metrics_port is not None:
            self._metrics_server = MetricsServer(
                self.stats,
                self.instance,
                self.health,
                self.config.metrics_host,
                self.config.metrics_port,
                refresh=self.update_gauges,
            )
            self._metrics_server.start()
        self._poller.start()
        self._kafka_checker.start()
        self._open = True
        mqtt = self.settings.mqtt
        try:
            if self.config.mqtt_protocol == "5":
                properties = Properties(PacketTypes.CONNECT)
                properties.SessionExpiryInterval = self.config.session_expiry_s
                properties.ReceiveMaximum = min(self.config.max_inflight, 65535)
                self._mqtt.connect(
                    mqtt.host, mqtt.port, keepalive=mqtt.keepalive_s, clean_start=False, properties=properties
                )
            else:
                self._mqtt.connect(mqtt.host, mqtt.port, keepalive=mqtt.keepalive_s)
        except OSError as exc:
            self._shutdown_threads()
            raise ServiceUnavailable(f"cannot connect to the MQTT broker {mqtt.url}: {exc}") from exc
        self._mqtt.loop_start()
        if not self._subscribed.wait(wait_subscribed_s):
            self.stop(drain=False)
            raise ServiceUnavailable(f"MQTT broker {mqtt.url} did not confirm the subscription")
        log.info(
            "gateway %s: MQTT %s %s -> Kafka %s (max in flight %d)",
            self.instance,
            mqtt.url,
            ", ".join(self._filters()),
            self.settings.kafka.bootstrap_servers,
            self.config.max_inflight,
        )

    @property
    def metrics_port(self) -> int | None:
        return self._metrics_server.port if self._metrics_server else None

    def _filters(self) -> list[str]:
        group = self.config.shared_group
        return [f"$share/{group}/{f}" if group else f for f in self.router.subscriptions()]

    # -- MQTT side (paho network thread) ----------------------------------------------------

    def _on_connect(self, client: paho.Client, _userdata: Any, flags: Any, reason_code: Any, _props: Any) -> None:
        if reason_code.is_failure:
            log.error("MQTT broker refused the connection: %s", reason_code)
            return
        # a PUBACK belongs to one connection: acks of messages received before this reconnect
        # are dropped (the broker redelivers those), never sent with a reused packet id
        self._generation += 1
        self.stats.mqtt_connected = True
        session = "resumed" if getattr(flags, "session_present", False) else "new"
        log.info("connected to MQTT (%s session)", session)
        client.subscribe([(f, 1) for f in self._filters()])

    def _on_disconnect(self, _client: paho.Client, _userdata: Any, _flags: Any, reason_code: Any, _props: Any) -> None:
        self.stats.mqtt_connected = False
        if not self._disconnecting:
            log.warning(
                "MQTT connection lost (%s): reconnecting; unconfirmed messages will be redelivered", reason_code
            )

    def _on_message(self, _client: paho.Client, _userdata: Any, message: paho.MQTTMessage) -> None:
        """The hot path: one message to one Kafka record (reading or dead letter)."""
        if not self._open:
            return  # draining: left unacknowledged, the broker redelivers it to the next session
        received_at = time.monotonic()
        now_ms = time.time_ns() // 1_000_000
        self.stats.received += 1
        try:
            topic = message.topic
        except UnicodeDecodeError:  # paho raises on a topic that is not UTF-8 (mosquitto refuses those)
            topic = bytes(message._topic).decode("utf-8", "replace")
        payload: bytes = message.payload  # type: ignore[assignment]  # paho's parser (and ours) gives bytes, not bytearray
        qos = message.qos
        headers: KafkaHeaders = [
            (H_MQTT_TOPIC, topic.encode()),
            (H_MQTT_QOS, _QOS_BYTES[qos]),
            (H_INGEST_MS, b"%d" % now_ms),
            (H_GATEWAY, self._instance_bytes),
        ]
        reason = None
        key: bytes | None  # the rule's, or the dead letter's
        try:
            rule = self.router.match(topic)
            parsed = self._validate(rule, topic, payload, now_ms)
            kafka_topic, key = rule.route(topic, parsed)
            value = payload
        except ContractViolation as exc:
            reason, detail = exc.reason, exc.detail
        except RoutingError as exc:
            reason, detail = "unroutable", str(exc)
        except Exception as exc:
            reason, detail = "processing_error", f"{type(exc).__name__}: {exc}"
        if reason is not None:
            kafka_topic, key, value, headers = self._dead_letter(reason, detail, topic, payload, headers)
        pending = _Pending(
            message.mid, qos, self._generation, received_at, kafka_topic, key, value, headers, reason, topic
        )
        pending_id = next(self._ids)
        self._pending[pending_id] = pending
        self.stats.inflight = len(self._pending)
        self._produce(pending_id, pending)

    def _validate(self, rule: CompiledRule, topic: str, payload: bytes, now_ms: int) -> Any:
        if not rule.validate_contract:
            try:
                parsed = msgspec.json.decode(payload)
            except msgspec.DecodeError:
                return {}
            return parsed if isinstance(parsed, dict) else {}
        reading = decode_telemetry(
            payload,
            now_ms=now_ms,
            max_bytes=self.config.max_payload_bytes,
            max_future_skew_ms=self.config.max_future_skew_ms,
            metrics_of=KNOWN_METRICS,
        )
        site, device_type, device_id, _kind = parse_device_topic(topic)
        if device_id != reading.device_id or site != reading.site or device_type != reading.device_type:
            raise ContractViolation(
                "topic_mismatch",
                f"topic {topic!r} does not match payload site/device_type/"
                f"device_id {reading.site}/{reading.device_type}/{reading.device_id}",
            )
        self._account_seq(reading.device_id, reading.seq)
        if reading.ts > self._newest_event_ms:
            self._newest_event_ms = reading.ts
        return reading

    def _account_seq(self, device_id: str, seq: int) -> None:
        """Duplicates and gaps per device. The map is kept in least-recently-seen order and
        capped at ``max_devices``: a forgotten device that comes back starts afresh (its
        next seq is neither a duplicate nor a gap), memory stays bounded."""
        seen = self._last_seq
        last = seen.pop(device_id, None)
        if last is None:
            seen[device_id] = seq
            if len(seen) > self.config.max_devices:
                del seen[next(iter(seen))]
                self.stats.devices_forgotten += 1
            return
        if seq <= last:
            self.stats.duplicates += 1
            seen[device_id] = last
            return
        if seq > last + 1:
            self.stats.seq_gaps += seq - last - 1
        seen[device_id] = seq

    @property
    def tracked_devices(self) -> int:
        """Devices whose last seq is remembered (at most ``max_devices``)."""
        return len(self._last_seq)

    def _dead_letter(
        self, reason: str, detail: str, topic: str, payload: bytes, headers: KafkaHeaders
    ) -> tuple[str, bytes | None, bytes, KafkaHeaders]:
        """The dead-letter record: the original bytes, or an excerpt when too large to carry."""
        try:
            key: bytes | None = parse_device_topic(topic)[2].encode()
        except ContractViolation:
            key = topic.encode(errors="replace")
        extra = [(name, value) for name, value in headers if name != H_MQTT_TOPIC and isinstance(value, bytes)]
        value = payload
        if len(payload) > self.config.max_payload_bytes:
            value, sizes = excerpt(payload, self.config.dead_letter_excerpt_bytes)
            extra += sizes
        letter = DeadLetter(reason, detail, "gateway", value, key, topic)
        return self.settings.topics.dlq, key, value, list(letter.headers(extra))

    # -- Kafka side ------------------------------------------------------------------------

    def _produce(self, pending_id: int, pending: _Pending) -> None:
        while True:
            try:
                self._producer.produce(
                    pending.topic,
                    pending.value,
                    pending.key,
                    headers=pending.headers,
                    on_delivery=functools.partial(self._on_delivery, pending_id),
                )
                return
            except BufferError:
                time.sleep(0.01)  # local queue full: the poller thread is draining it
            except KafkaException as exc:
                error = exc.args[0]
                if error.fatal():
                    log.error("produce failed (%s); will retry after the producer is recreated", exc)
                    self._recreate_producer.set()
                    return
                if error.code() in _REFUSED_ERRORS and pending.value:
                    pending = self._refused(pending_id, pending, error)  # this record, not the producer
                    continue
                log.warning("produce failed (%s); trying again in 1 s", exc)  # e.g. a topic not created yet
                time.sleep(1.0)
            except (TypeError, ValueError) as exc:  # e.g. a header Kafka cannot carry
                if not pending.value:  # nothing left to cut: a configuration problem (e.g. the topic name)
                    log.error(
                        "Kafka refuses even the bare dead letter from %s (%s); trying again in 1 s",
                        pending.mqtt_topic,
                        exc,
                    )
                    time.sleep(1.0)
                    continue
                pending = self._refused(pending_id, pending, exc)

    def _refused(self, pending_id: int, pending: _Pending, error: Any) -> _Pending:
        """Kafka refuses this record for what it is: its dead letter instead, cut to an excerpt
        (a dead letter refused in its turn is sent again with no value at all)."""
        log.warning("Kafka refused a record from %s (%s): dead-lettering it", pending.mqtt_topic, error)
        headers = [h for h in pending.headers if not h[0].startswith("iotwatch.") or h[0] in (H_INGEST_MS, H_GATEWAY)]
        if pending.reason is None:
            topic, key, value, headers = self._dead_letter(
                "kafka_refused", str(error), pending.mqtt_topic, pending.value, headers
            )
            if len(value) > self.config.dead_letter_excerpt_bytes:
                value, sizes = excerpt(pending.value, self.config.dead_letter_excerpt_bytes)
                headers += sizes
            reason = "kafka_refused"
        else:
            topic, key, value, reason = pending.topic, pending.key, b"", pending.reason
            headers = [h for h in pending.headers if h[0] != "iotwatch.detail"] + [
                ("iotwatch.detail", f"dead letter refused by Kafka ({error}): value left out".encode())
            ]
        replacement = pending._replace(topic=topic, key=key, value=value, headers=headers, reason=reason)
        self._pending[pending_id] = replacement
        return replacement

    def _on_delivery(self, pending_id: int, err: KafkaError | None, _msg: Message) -> None:
        """Delivery reports (poller thread): count, then acknowledge to MQTT."""
        pending = self._pending.get(pending_id)
        if pending is None:
            return
        stats = self.stats
        if err is not None:
            code = err.code()
            if code in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
                return  # the replacement producer sends it again
            stats.delivery_failures += 1
            if code in _REFUSED_ERRORS and pending.value:
                self._produce(pending_id, self._refused(pending_id, pending, err))
                return
            log.warning("Kafka delivery failed (%s); producing again", err)
            if err.fatal():
                self._recreate_producer.set()
            else:
                self._produce(pending_id, pending)
            return
        del self._pending[pending_id]
        now = time.monotonic()
        stats.inflight = len(self._pending)
        stats.observe_delivery(now - pending.received_at, pending.reason)
        stats.kafka_up = True
        self._last_delivery_at = now
        if pending.qos and pending.generation == self._generation:
            self._acks.append(pending.mid)  # sent together once this poll's reports are served

    def _send_acks(self) -> None:
        """PUBACK what Kafka confirmed in the last poll, in one write (poller thread)."""
        if self._acks:
            acks, self._acks = self._acks, []
            self._mqtt.ack_many(acks)

    def _on_kafka_error(self, err: KafkaError) -> None:
        if err.code() in _KAFKA_DOWN_ERRORS:
            was_up, self.stats.kafka_up = self.stats.kafka_up, False
            if was_up:
                log.error(
                    "Kafka unreachable (%s): holding %d message(s) unacknowledged; the broker keeps the rest",
                    err.str(),
                    self.stats.inflight,
                )
        elif err.fatal():
            log.error("Kafka producer fatal error (%s): recreating the producer", err.str())
            self._recreate_producer.set()
        else:
            log.warning("Kafka: %s", err.str())

    def _poll_kafka(self) -> None:
        """Serve delivery reports; recreate the producer after a fatal error or a stall."""
        next_stall_check = time.monotonic() + 1.0
        while not self._stopped.is_set():
            try:
                self._producer.poll(0.1)
            except Exception:
                log.exception("error while serving Kafka delivery reports")
            self._send_acks()
            if time.monotonic() >= next_stall_check:
                next_stall_check = time.monotonic() + 1.0
                if self._stalled():
                    log.error(
                        "Kafka is reachable but has confirmed nothing for %.0f s (e.g. the broker lost its "
                        "producer state on restart)",
                        self.config.stall_timeout_s,
                    )
                    self._recreate_producer.set()
            if self._recreate_producer.is_set():
                self._recreate_producer.clear()
                self._replace_producer()

    def _check_kafka(self) -> None:
        """Ask the cluster for its metadata now and every ``kafka_check_interval_s``: Kafka's
        state is known from the start and while idle, not only from delivery reports."""
        interval = self.config.kafka_check_interval_s
        first = True
        while True:
            try:
                self._producer.list_topics(timeout=interval)
                up, reason = True, ""
            except KafkaException as exc:
                up, reason = False, str(exc.args[0].str() if exc.args else exc)
            was_up, self.stats.kafka_up = self.stats.kafka_up, up
            if not up and (was_up or first):
                # a certificate the client cannot verify, or a protocol mismatch, said as such
                refused = tls_refused(self.settings.kafka, [])
                reason = str(refused) if refused is not None else reason
                log.error("Kafka %s unreachable (metadata request: %s)", self.settings.kafka.bootstrap_servers, reason)
            elif up and not was_up:
                self._kafka_back_at = time.monotonic()
                log.info("Kafka %s answers", self.settings.kafka.bootstrap_servers)
            first = False
            if self._stopped.wait(interval):
                return

    def _oldest_pending(self, default: float) -> float:
        pending = list(self._pending.values())  # a copy: the MQTT thread adds meanwhile
        return min((p.received_at for p in pending), default=default)

    def _stalled(self) -> bool:
        """Kafka reachable, messages waiting, and nothing confirmed for ``stall_timeout_s``
        since the last delivery, the oldest message's arrival or Kafka's return after an
        outage (the producer gets that long to deliver its backlog before it counts as stuck)."""
        now = time.monotonic()
        last_progress = max(self._last_delivery_at, self._oldest_pending(now), self._kafka_back_at)
        if now - last_progress < self.config.stall_timeout_s:
            return False
        try:
            self._producer.list_topics(timeout=2.0)  # reachable? then the producer itself is stuck
        except KafkaException:
            self._kafka_back_at = time.monotonic()
            return False  # Kafka is down, not the producer: the outage is reported and waited out
        if time.monotonic() - now > 1.0:  # a broker that answers only now is coming back: give it time
            self._kafka_back_at = time.monotonic()
            return False
        return True

    def _replace_producer(self) -> None:
        old, self._producer = self._producer, self._make_producer()
        old.purge(in_queue=True, in_flight=True)  # its reports come back as _PURGE_*: ignored
        old.poll(0)
        self._last_delivery_at = time.monotonic()
        pending = sorted(list(self._pending.items()))
        log.warning("producing %d unconfirmed message(s) again on a new producer", len(pending))
        for pending_id, item in pending:
            self._produce(pending_id, item)

    # -- health, status, stop -----------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        snap = self.stats.snapshot()
        if not snap["mqtt_connected"]:
            return False, "MQTT broker not connected"
        if not snap["kafka_up"]:
            return False, f"Kafka unreachable, {snap['inflight']} message(s) waiting"
        if snap["inflight"] >= self.config.max_inflight:
            return False, f"in-flight buffer full ({snap['inflight']}/{self.config.max_inflight}); backpressure on MQTT"
        return True, f"forwarded {snap['forwarded']}, in flight {snap['inflight']}"

    def update_gauges(self) -> None:
        """Set the gauges from the state now (each scrape and each status period)."""
        now = time.monotonic()
        oldest = self._oldest_pending(now)
        self.stats.oldest_inflight_s = now - oldest
        self.stats.inflight = len(self._pending)
        if now - oldest > 5 and now - self._last_delivery_at > 5:
            self.stats.kafka_up = False  # nothing confirmed for 5 s while messages wait
        newest, self._newest_event_ms = self._newest_event_ms, 0
        if newest:
            self._newest_seen_ms = newest
        if self._newest_seen_ms:
            self.stats.newest_reading_age_s = max(0.0, time.time() - self._newest_seen_ms / 1000.0)

    def refresh_gauges(self) -> dict[str, Any]:
        self.update_gauges()
        snapshot = self.stats.snapshot()
        snapshot["tracked_devices"] = self.tracked_devices
        return snapshot

    def report(self) -> dict[str, Any]:
        """Refresh gauges, log the status line, write the InfluxDB points when configured."""
        snap = self.refresh_gauges()
        log.info(status_line(snap))
        if self._influx is not None:
            try:
                self._influx.write_points(influx_points(snap, self.instance, int(time.time() * 1000)))
            except IotwatchError as exc:
                self._influx_outage.failed(exc)
            else:
                self._influx_outage.written()
        return snap

    def run(self, stop: threading.Event) -> None:
        """Report every ``status_interval_s`` until ``stop`` is set."""
        while not stop.wait(self.config.status_interval_s):
            self.report()

    def stop(self, drain: bool = True) -> dict[str, Any]:
        """Stop taking messages, wait for Kafka to confirm those in flight (acking them),
        then disconnect. Unconfirmed leftovers stay unacknowledged: the broker redelivers them."""
        self._open = False
        if drain:
            deadline = time.monotonic() + self.config.drain_timeout_s
            while self.stats.inflight and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.stats.inflight:
                log.warning(
                    "%d message(s) not confirmed by Kafka before the drain timeout: left unacknowledged for redelivery",
                    self.stats.inflight,
                )
        time.sleep(0.1)  # let the network thread send the last PUBACKs
        self._disconnecting = True
        self._mqtt.disconnect()
        self._mqtt.loop_stop()
        self._shutdown_threads()
        summary = self.refresh_gauges()
        if self._influx is not None:
            self._influx.close()
        return summary

    def _shutdown_threads(self) -> None:
        self._stopped.set()
        for thread in (self._poller, self._kafka_checker):
            if thread.is_alive():
                thread.join(timeout=5)
        self._producer.flush(1.0)
        if self._metrics_server is not None:
            self._metrics_server.stop()
            self._metrics_server = None
