"""paho-mqtt clients configured from :class:`~iotwatch.settings.MqttSettings`."""

from __future__ import annotations

import ssl
import threading
import uuid
from typing import Literal

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from iotwatch.errors import ServiceUnavailable
from iotwatch.settings import MqttSettings


def make_client(settings: MqttSettings, client_id: str = "", *, clean_session: bool = True,
                manual_ack: bool = False, protocol: Literal["3.1.1", "5"] = "3.1.1") -> paho.Client:
    """An unconnected MQTT client with credentials and TLS applied.

    MQTT 5 has no clean-session flag at construction: pass ``clean_start`` and session
    properties to ``connect()`` instead (``clean_session`` is ignored for it).
    """
    if protocol == "5":
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=MQTTProtocolVersion.MQTTv5, manual_ack=manual_ack)
    else:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean_session,
                             protocol=MQTTProtocolVersion.MQTTv311, manual_ack=manual_ack)
    if settings.username:
        password = settings.password.get_secret_value() if settings.password else None
        client.username_pw_set(settings.username, password)
    if settings.use_tls:
        client.tls_set(ca_certs=str(settings.tls_ca_file) if settings.tls_ca_file else None,
                       cert_reqs=ssl.CERT_NONE if settings.tls_insecure else ssl.CERT_REQUIRED)
        client.tls_insecure_set(settings.tls_insecure)
    return client


def round_trip(settings: MqttSettings, timeout_s: float = 5.0) -> None:
    """Publish a QoS 1 message to a fresh topic and receive it back, or raise."""
    topic = f"iotwatch/health/{uuid.uuid4().hex}"
    payload = uuid.uuid4().bytes
    subscribed = threading.Event()
    received = threading.Event()
    client = make_client(settings, f"iotwatch-health-{uuid.uuid4().hex[:8]}")
    client.on_subscribe = lambda *_args: subscribed.set()
    client.on_message = lambda _c, _u, msg: received.set() if msg.payload == payload else None
    try:
        client.connect(settings.host, settings.port, keepalive=settings.keepalive_s)
    except OSError as exc:
        raise ServiceUnavailable(f"MQTT broker {settings.url} refused the connection: {exc}") from exc
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        if not subscribed.wait(timeout_s):
            raise ServiceUnavailable(f"MQTT broker {settings.url} did not acknowledge a subscription")
        client.publish(topic, payload, qos=1)
        if not received.wait(timeout_s):
            raise ServiceUnavailable(f"MQTT broker {settings.url} did not deliver a test message")
    finally:
        client.disconnect()
        client.loop_stop()
