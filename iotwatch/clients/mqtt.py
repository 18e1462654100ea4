"""paho-mqtt clients configured from :class:`~iotwatch.settings.MqttSettings`."""

from __future__ import annotations

import queue
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

from iotwatch.errors import ServiceUnavailable
from iotwatch.settings import MqttSettings

_PUBACK_HEADER = (paho.PUBACK << 24) | (2 << 16)  # command byte, remaining length 2, then the packet id


class BufferedReadClient(paho.Client):
    """A paho client that reads the socket 64 KiB at a time and delivers plain telemetry on a short path
    (docs/internals.md, "Buffered reads over MQTT"). It overrides private methods of paho 2, which the
    pyproject pins below 3."""

    _read_buffer: bytes = b""
    _read_at: int = 0
    _filtered_callbacks: bool = False

    def _sock_recv(self, bufsize: int) -> bytes:
        if self._read_at >= len(self._read_buffer):
            data = super()._sock_recv(65536)
            if not data:
                return data
            self._read_buffer, self._read_at = data, 0
        start = self._read_at
        self._read_at = min(start + bufsize, len(self._read_buffer))
        return self._read_buffer[start : self._read_at]

    def _sock_close(self) -> None:
        self._read_buffer, self._read_at = b"", 0  # bytes of a lost connection never reach the next one
        super()._sock_close()

    def ack_many(self, mids: list[int]) -> None:
        """PUBACK each QoS 1 message in ``mids`` (manual acks) in one write: stock paho queues
        each PUBACK as its own packet, with a wake-up of the network thread and a ``send``
        each. The bytes are those of paho's own PUBACK (MQTT 3.1.1 and 5: a success)."""
        if mids:
            packet = struct.pack(f"!{len(mids)}I", *(_PUBACK_HEADER | mid for mid in mids))
            self._packet_queue(paho.PUBACK, packet, 0, 0)

    def message_callback_add(self, sub: str, callback: Any) -> None:
        self._filtered_callbacks = True  # paho's path matches each topic against them
        super().message_callback_add(sub, callback)

    def _handle_publish(self) -> MQTTErrorCode:
        packet = self._in_packet["packet"]
        header = self._in_packet["command"]
        qos = (header & 0x06) >> 1
        v5 = self._protocol == MQTTProtocolVersion.MQTTv5
        topic_end = 2 + int.from_bytes(packet[:2], "big")
        start = topic_end + (2 if qos else 0)  # the packet id, then MQTT 5's properties length
        if (
            qos == 2
            or self._filtered_callbacks
            or self._logger is not None
            or self.on_log is not None
            or len(packet) < start + v5
            or (v5 and packet[start] != 0)  # properties: paho decodes them
            or (not v5 and topic_end == 2)  # an empty topic: paho refuses it as malformed
        ):
            return super()._handle_publish()
        message: Any = paho.MQTTMessage.__new__(paho.MQTTMessage)  # no __init__: no Condition
        message.timestamp = paho.time_func()  # the clock paho stamps its messages with
        message.state = paho.mqtt_ms_invalid
        message.dup = bool(header & 0x08)
        message.retain = bool(header & 0x01)
        message.qos = qos
        message.mid = int.from_bytes(packet[topic_end:start], "big")
        message._topic = bytes(packet[2:topic_end])
        message.payload = bytes(packet[start + v5 :])
        message.properties = None
        message.info = None  # only outgoing messages are waited on
        on_message = self.on_message
        if on_message is not None:
            with self._in_callback_mutex:
                try:
                    on_message(self, self._userdata, message)
                except Exception:
                    if not self.suppress_exceptions:
                        raise
        if qos and not self._manual_ack:
            return self._send_puback(message.mid)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:
        rc = super().loop_read(max_packets)
        while (
            rc == MQTTErrorCode.MQTT_ERR_SUCCESS and self._sock is not None and self._read_at < len(self._read_buffer)
        ):
            rc = super().loop_read(max_packets)
        return rc


def make_client(
    settings: MqttSettings,
    client_id: str = "",
    *,
    clean_session: bool = True,
    manual_ack: bool = False,
    protocol: Literal["3.1.1", "5"] = "3.1.1",
    buffered_reads: bool = False,
    client_class: type[paho.Client] | None = None,
) -> paho.Client:
    """An unconnected MQTT client with credentials and TLS applied.

    MQTT 5 has no clean-session flag at construction: pass ``clean_start`` and session
    properties to ``connect()`` instead (``clean_session`` is ignored for it).
    ``buffered_reads`` gives a :class:`BufferedReadClient` (for subscribers that drain a lot);
    ``client_class`` another subclass of ``paho.Client``.
    """
    kind = client_class or (BufferedReadClient if buffered_reads else paho.Client)
    if protocol == "5":
        client = kind(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5, manual_ack=manual_ack
        )
    else:
        client = kind(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=clean_session,
            protocol=MQTTProtocolVersion.MQTTv311,
            manual_ack=manual_ack,
        )
    if settings.username:
        password = settings.password.get_secret_value() if settings.password else None
        client.username_pw_set(settings.username, password)
    if settings.use_tls:
        client.tls_set(
            ca_certs=str(settings.tls_ca_file) if settings.tls_ca_file else None,
            cert_reqs=ssl.CERT_NONE if settings.tls_insecure else ssl.CERT_REQUIRED,
        )
        client.tls_insecure_set(settings.tls_insecure)
    return client


@contextmanager
def _subscribed(
    settings: MqttSettings, name: str, topic: str, on_message: Callable[[paho.MQTTMessage], None], timeout_s: float
) -> Iterator[paho.Client]:
    """A short-lived client subscribed to ``topic`` at QoS 1 (acknowledged), disconnected
    at the end; ServiceUnavailable when the broker refuses or does not acknowledge."""
    subscribed = threading.Event()
    client = make_client(settings, f"iotwatch-{name}-{uuid.uuid4().hex[:8]}")
    client.on_subscribe = lambda *_args: subscribed.set()
    client.on_message = lambda _c, _u, msg: on_message(msg)
    try:
        client.connect(settings.host, settings.port, keepalive=settings.keepalive_s)
    except OSError as exc:
        raise ServiceUnavailable(f"MQTT broker {settings.url} refused the connection: {exc}") from exc
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        if not subscribed.wait(timeout_s):
            raise ServiceUnavailable(f"MQTT broker {settings.url} did not acknowledge a subscription")
        yield client
    finally:
        client.disconnect()
        client.loop_stop()


def round_trip(settings: MqttSettings, timeout_s: float = 5.0) -> None:
    """Publish a QoS 1 message to a fresh topic and receive it back, or raise."""
    topic = f"iotwatch/health/{uuid.uuid4().hex}"
    payload = uuid.uuid4().bytes
    received = threading.Event()
    with _subscribed(
        settings, "health", topic, lambda msg: received.set() if msg.payload == payload else None, timeout_s
    ) as client:
        client.publish(topic, payload, qos=1)
        if not received.wait(timeout_s):
            raise ServiceUnavailable(f"MQTT broker {settings.url} did not deliver a test message")


def retained(settings: MqttSettings, topic: str, timeout_s: float = 3.0) -> bytes | None:
    """The retained message of ``topic`` (None: none), read by subscribing once: the broker
    sends a retained message before it acknowledges the subscription."""
    got: list[bytes] = []
    with _subscribed(
        settings, "retained", topic, lambda msg: got.append(bytes(msg.payload)) if msg.retain else None, timeout_s
    ):
        time.sleep(0.2)  # the retained message is in flight before the acknowledgement: let it land
    return got[-1] if got else None


class PersistentSession:
    """A persistent MQTT session (fixed client id, clean session off) that subscribes at QoS 1
    to ``filters`` on every connect and queues what arrives as (topic, payload). While the
    client is away the broker keeps the session and queues QoS 1 messages for it: both ends
    of device commands rely on that."""

    def __init__(self, settings: MqttSettings, client_id: str, filters: list[str]) -> None:
        self.settings, self.filters = settings, filters
        self.received: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self._ready = threading.Event()
        self._refused: str | None = None
        self.client = make_client(settings, client_id, clean_session=False)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *_: self._ready.set()
        self.client.on_message = lambda _c, _u, m: self.received.put((m.topic, bytes(m.payload)))

    def _on_connect(self, client: paho.Client, _u: object, _flags: object, reason: Any, _p: object) -> None:
        if reason.is_failure:
            self._refused = str(reason)
            self._ready.set()
        elif self.filters:
            client.subscribe([(topic, 1) for topic in self.filters])
        else:
            self._ready.set()

    def connect(self, timeout_s: float = 15.0) -> None:
        """Connect and wait until the subscriptions are confirmed, or :class:`ServiceUnavailable`."""
        try:
            self.client.connect(self.settings.host, self.settings.port, keepalive=self.settings.keepalive_s)
        except OSError as exc:
            raise ServiceUnavailable(f"MQTT broker {self.settings.url} refused the connection: {exc}") from exc
        self.client.loop_start()
        if not self._ready.wait(timeout_s) or self._refused:
            self.close()
            raise ServiceUnavailable(f"MQTT broker {self.settings.url}: {self._refused or 'no answer'}")

    def connected(self) -> bool:
        return bool(self.client.is_connected())

    def publish(self, topic: str, payload: bytes, timeout_s: float = 15.0) -> None:
        """Publish at QoS 1 and wait for the broker's PUBACK."""
        info = self.client.publish(topic, payload, qos=1)
        try:
            info.wait_for_publish(timeout_s)
        except (RuntimeError, ValueError) as exc:  # not connected (the broker restarting), queue full
            raise ServiceUnavailable(f"MQTT broker {self.settings.url}: {topic} not sent: {exc}") from exc
        if not info.is_published():
            raise ServiceUnavailable(f"MQTT broker {self.settings.url} did not acknowledge a message on {topic}")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
