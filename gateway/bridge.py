"""The bridge: MQTT in, Kafka out, nothing acknowledged before Kafka has it.

Delivery guarantee (at-least-once, end to end):

- The gateway subscribes with QoS 1 on a persistent session (fixed client id, MQTT 5
  ``clean_start=False`` with a session expiry), so the broker queues while it is down.
- Messages are acknowledged manually (paho ``manual_ack``): the PUBACK for a message is sent
  only from the Kafka delivery report of the record it became (the forwarded reading or its
  dead letter). A crash before that makes the broker deliver it again: a duplicate, never a gap.
- MQTT 5 Receive Maximum = ``max_inflight`` bounds what the broker sends before acks come
  back, so while Kafka is unreachable the buffer stays bounded and the backlog waits at the
  broker. (MQTT 3.1.1 has no such field: the broker's own in-flight limit applies.)
- The Kafka producer is idempotent (acks=all) and retries without a deadline
  (``message.timeout.ms=0``), so a Kafka outage delays delivery but reorders nothing.
- A PUBACK belongs to one connection: acknowledgements for messages received before a
  reconnect are dropped (the broker redelivers those), never sent with a reused packet id.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from confluent_kafka import KafkaError, Message, Producer
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from iotwatch.clients.influx import InfluxV1Client
from iotwatch.clients.kafka import client_config
from iotwatch.clients.mqtt import make_client
from iotwatch.contract import ContractViolation, Telemetry, decode_telemetry, parse_device_topic
from iotwatch.deadletter import H_GATEWAY, H_INGEST_MS, H_MQTT_QOS, H_MQTT_TOPIC, DeadLetter
from iotwatch.errors import IotwatchError, ServiceUnavailable
from iotwatch.settings import MappingRule, Settings
from gateway.mapping import Router, RoutingError
from gateway.metrics import GatewayStats, MetricsServer, influx_points, status_line

log = logging.getLogger(__name__)

_KAFKA_DOWN_ERRORS = {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE}


@dataclass
class _Pending:
    """A received MQTT message whose Kafka record is not confirmed yet."""

    mid: int
    qos: int
    generation: int
    received_at: float
    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


class Gateway:
    """One gateway instance. ``start()``, then ``stop()`` (drains in-flight messages)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.config = settings.gateway
        self.instance = self.config.client_id
        self.router = Router(self.config.rules, settings.topics)
        self.stats = GatewayStats()
        self._lock = self.stats.lock
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count()
        self._last_seq: dict[str, int] = {}
        self._generation = 0
        self._last_delivery_at = time.monotonic()
        self._accepting = threading.Event()
        self._stopped = threading.Event()
        self._recreate_producer = threading.Event()
        self._subscribed = threading.Event()
        self._producer = self._make_producer()
        self._mqtt = self._make_mqtt()
        self._poller = threading.Thread(target=self._poll_kafka, name="gateway-kafka-poll", daemon=True)
        self._metrics_server: MetricsServer | None = None
        self._influx = InfluxV1Client(settings.influx) if settings.influx.enabled else None

    # -- set-up -------------------------------------------------------------------------

    def _make_producer(self) -> Producer:
        return Producer({
            **client_config(self.settings.kafka),
            "client.id": self.instance,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": 0,  # retry until delivered: an outage delays, never drops
            "linger.ms": 5,
            "compression.type": "lz4",
            "error_cb": self._on_kafka_error,
        })

    def _make_mqtt(self) -> paho.Client:
        client = make_client(self.settings.mqtt, self.instance, clean_session=False, manual_ack=True,
                             protocol=self.config.mqtt_protocol)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = lambda *_args: self._subscribed.set()
        client.reconnect_delay_set(min_delay=1, max_delay=10)
        return client

    def start(self, wait_subscribed_s: float = 15.0) -> None:
        """Connect to both sides, start serving metrics; returns once subscribed."""
        if self.config.metrics_port is not None:
            self._metrics_server = MetricsServer(self.stats, self.instance, self.health,
                                                 self.config.metrics_host, self.config.metrics_port)
            self._metrics_server.start()
        self._poller.start()
        self._accepting.set()
        mqtt = self.settings.mqtt
        try:
            if self.config.mqtt_protocol == "5":
                properties = Properties(PacketTypes.CONNECT)
                properties.SessionExpiryInterval = self.config.session_expiry_s
                properties.ReceiveMaximum = min(self.config.max_inflight, 65535)
                self._mqtt.connect(mqtt.host, mqtt.port, keepalive=mqtt.keepalive_s, clean_start=False,
                                   properties=properties)
            else:
                self._mqtt.connect(mqtt.host, mqtt.port, keepalive=mqtt.keepalive_s)
        except OSError as exc:
            self._shutdown_threads()
            raise ServiceUnavailable(f"cannot connect to the MQTT broker {mqtt.url}: {exc}") from exc
        self._mqtt.loop_start()
        if not self._subscribed.wait(wait_subscribed_s):
            self.stop(drain=False)
            raise ServiceUnavailable(f"MQTT broker {mqtt.url} did not confirm the subscription")
        log.info("gateway %s: %s -> Kafka %s (max in flight %d)", self.instance,
                 ", ".join(self._filters()), self.settings.kafka.bootstrap_servers, self.config.max_inflight)

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
        with self._lock:
            self._generation += 1
            self.stats.mqtt_connected = True
        session = "resumed" if getattr(flags, "session_present", False) else "new"
        log.info("connected to MQTT (%s session)", session)
        client.subscribe([(f, 1) for f in self._filters()])

    def _on_disconnect(self, _client: paho.Client, _userdata: Any, _flags: Any, reason_code: Any, _props: Any) -> None:
        with self._lock:
            self.stats.mqtt_connected = False
        if not self._stopped.is_set():
            log.warning("MQTT connection lost (%s): reconnecting; unconfirmed messages will be redelivered",
                        reason_code)

    def _on_message(self, _client: paho.Client, _userdata: Any, message: paho.MQTTMessage) -> None:
        if not self._accepting.is_set():
            return  # draining: left unacknowledged, the broker redelivers it to the next session
        received_at = time.monotonic()
        ingest_ms = str(int(time.time() * 1000)).encode()
        topic = message.topic
        headers = [(H_MQTT_TOPIC, topic.encode()), (H_MQTT_QOS, str(message.qos).encode()),
                   (H_INGEST_MS, ingest_ms), (H_GATEWAY, self.instance.encode())]
        payload = message.payload
        try:
            rule = self.router.rule_for(topic)
            parsed = self._validate(rule, topic, payload)
            route = self.router.route(rule, topic, parsed)
            kafka_topic, key, value = route.kafka_topic, route.key, payload
        except ContractViolation as exc:
            kafka_topic, key, value, headers = self._dead_letter(exc.reason, exc.detail, topic, payload, headers)
        except RoutingError as exc:
            kafka_topic, key, value, headers = self._dead_letter("unroutable", str(exc), topic, payload, headers)
        pending = _Pending(message.mid, message.qos, self._generation, received_at, kafka_topic, key, value, headers)
        pending_id = next(self._ids)
        with self._lock:
            self.stats.received += 1
            self._pending[pending_id] = pending
            self.stats.inflight = len(self._pending)
        self._produce(pending_id, pending)

    def _validate(self, rule: MappingRule, topic: str, payload: bytes) -> Telemetry | dict[str, Any]:
        if not rule.validate_contract:
            try:
                parsed = json.loads(payload)
            except (UnicodeDecodeError, json.JSONDecodeError):
                return {}
            return parsed if isinstance(parsed, dict) else {}
        reading = decode_telemetry(payload, max_bytes=self.config.max_payload_bytes,
                                   max_future_skew_ms=self.config.max_future_skew_ms)
        site, device_type, device_id, _kind = parse_device_topic(topic)
        if (site, device_type, device_id) != (reading.site, reading.device_type, reading.device_id):
            raise ContractViolation("topic_mismatch", f"topic {topic!r} does not match payload site/device_type/"
                                                      f"device_id {reading.site}/{reading.device_type}/{reading.device_id}")
        self._account_seq(reading.device_id, reading.seq)
        return reading

    def _account_seq(self, device_id: str, seq: int) -> None:
        last = self._last_seq.get(device_id)
        with self._lock:
            if last is not None and seq <= last:
                self.stats.duplicates += 1
                return
            if last is not None and seq > last + 1:
                self.stats.seq_gaps += seq - last - 1
        self._last_seq[device_id] = seq

    def _dead_letter(self, reason: str, detail: str, topic: str, payload: bytes,
                     headers: list[tuple[str, bytes]]) -> tuple[str, bytes | None, bytes, list[tuple[str, bytes]]]:
        with self._lock:
            self.stats.dead_lettered[reason] += 1
        log.debug("dead letter from %s: %s: %s", topic, reason, detail)
        try:
            key: bytes | None = parse_device_topic(topic)[2].encode()
        except ContractViolation:
            key = topic.encode(errors="replace")
        letter = DeadLetter(reason, detail, "gateway", payload, key, topic)
        extra = [h for h in headers if h[0] != H_MQTT_TOPIC]
        return self.settings.topics.dlq, key, payload, letter.headers(extra)

    # -- Kafka side ------------------------------------------------------------------------

    def _produce(self, pending_id: int, pending: _Pending) -> None:
        while True:
            try:
                self._producer.produce(
                    pending.topic, value=pending.value, key=pending.key, headers=pending.headers,
                    on_delivery=lambda err, msg, pid=pending_id: self._on_delivery(pid, err, msg))
                return
            except BufferError:
                time.sleep(0.01)  # local queue full: the poller thread is draining it
            except Exception as exc:  # noqa: BLE001 - e.g. producer fenced/fatal: handled by recreation
                log.error("produce failed (%s); will retry after the producer is recreated", exc)
                self._recreate_producer.set()
                return

    def _on_delivery(self, pending_id: int, err: KafkaError | None, _msg: Message) -> None:
        with self._lock:
            pending = self._pending.get(pending_id)
        if pending is None:
            return
        if err is not None:
            if err.code() in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
                return  # the replacement producer sends it again
            with self._lock:
                self.stats.delivery_failures += 1
            log.warning("Kafka delivery failed (%s); producing again", err)
            if err.fatal():
                self._recreate_producer.set()
            else:
                self._produce(pending_id, pending)
            return
        with self._lock:
            self._pending.pop(pending_id, None)
            self.stats.inflight = len(self._pending)
            self.stats.observe_delivery(time.monotonic() - pending.received_at)
            self.stats.kafka_up = True
            self._last_delivery_at = time.monotonic()
            same_connection = pending.generation == self._generation
        if same_connection and pending.qos > 0:
            self._mqtt.ack(pending.mid, pending.qos)

    def _on_kafka_error(self, err: KafkaError) -> None:
        if err.code() in _KAFKA_DOWN_ERRORS:
            with self._lock:
                was_up, self.stats.kafka_up = self.stats.kafka_up, False
            if was_up:
                log.error("Kafka unreachable (%s): holding %d message(s) unacknowledged; the broker keeps the rest",
                          err.str(), self.stats.inflight)
        elif err.fatal():
            log.error("Kafka producer fatal error (%s): recreating the producer", err.str())
            self._recreate_producer.set()
        else:
            log.warning("Kafka: %s", err.str())

    def _poll_kafka(self) -> None:
        """Serve delivery reports; recreate the producer after a fatal error or a stall."""
        next_stall_check = time.monotonic() + 1.0
        while not self._stopped.is_set():
            self._producer.poll(0.1)
            if time.monotonic() >= next_stall_check:
                next_stall_check = time.monotonic() + 1.0
                if self._stalled():
                    log.error("Kafka is reachable but has confirmed nothing for %.0f s (e.g. the broker lost its "
                              "producer state on restart)", self.config.stall_timeout_s)
                    self._recreate_producer.set()
            if self._recreate_producer.is_set():
                self._recreate_producer.clear()
                self._replace_producer()

    def _stalled(self) -> bool:
        now = time.monotonic()
        with self._lock:
            oldest = min((p.received_at for p in self._pending.values()), default=now)
            last_progress = max(self._last_delivery_at, oldest)
        if now - last_progress < self.config.stall_timeout_s:
            return False
        try:
            self._producer.list_topics(timeout=2.0)  # reachable? then the producer itself is stuck
        except Exception:  # noqa: BLE001 - unreachable: an outage, not a stall; keep waiting
            return False
        return True

    def _replace_producer(self) -> None:
        old, self._producer = self._producer, self._make_producer()
        old.purge(in_queue=True, in_flight=True)  # its reports come back as _PURGE_*: ignored
        with self._lock:
            self._last_delivery_at = time.monotonic()
            pending = sorted(self._pending.items())
        log.warning("producing %d unconfirmed message(s) again on a new producer", len(pending))
        for pending_id, item in pending:
            self._produce(pending_id, item)

    # -- health, status, stop -----------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        snap = self.stats.snapshot()
        if not snap["mqtt_connected"]:
            return False, "MQTT broker not connected"
        if not snap["kafka_up"] and (snap["inflight"] or snap["received"] == 0 and snap["uptime_s"] > 10):
            return False, f"Kafka unreachable, {snap['inflight']} message(s) waiting"
        if snap["inflight"] >= self.config.max_inflight:
            return False, f"in-flight buffer full ({snap['inflight']}/{self.config.max_inflight}); backpressure on MQTT"
        return True, f"forwarded {snap['forwarded']}, in flight {snap['inflight']}"

    def refresh_gauges(self) -> dict[str, Any]:
        now = time.monotonic()
        with self._lock:
            oldest = min((p.received_at for p in self._pending.values()), default=now)
            self.stats.oldest_inflight_s = now - oldest
            if self._pending and now - oldest > 5:
                self.stats.kafka_up = False  # nothing confirmed for 5 s while messages wait
        return self.stats.snapshot()

    def report(self) -> dict[str, Any]:
        """Refresh gauges, log the status line, write the InfluxDB points when configured."""
        snap = self.refresh_gauges()
        log.info(status_line(snap))
        if self._influx is not None:
            try:
                self._influx.write_points(influx_points(snap, self.instance, int(time.time() * 1000)))
            except IotwatchError as exc:
                log.warning("gateway metrics not written to InfluxDB: %s", exc)
        return snap

    def run(self, stop: threading.Event) -> None:
        """Report every ``status_interval_s`` until ``stop`` is set."""
        while not stop.wait(self.config.status_interval_s):
            self.report()

    def stop(self, drain: bool = True) -> dict[str, Any]:
        """Stop taking messages, wait for Kafka to confirm those in flight (acking them),
        then disconnect. Unconfirmed leftovers stay unacknowledged: the broker redelivers them."""
        self._accepting.clear()
        if drain:
            deadline = time.monotonic() + self.config.drain_timeout_s
            while self.stats.inflight and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.stats.inflight:
                log.warning("%d message(s) not confirmed by Kafka before the drain timeout: left unacknowledged "
                            "for redelivery", self.stats.inflight)
        time.sleep(0.1)  # let the network thread send the last PUBACKs
        self._mqtt.disconnect()
        self._mqtt.loop_stop()
        self._shutdown_threads()
        summary = self.refresh_gauges()
        if self._influx is not None:
            self._influx.close()
        return summary

    def _shutdown_threads(self) -> None:
        self._stopped.set()
        if self._poller.is_alive():
            self._poller.join(timeout=5)
        self._producer.flush(1.0)
        if self._metrics_server is not None:
            self._metrics_server.stop()
            self._metrics_server = None
