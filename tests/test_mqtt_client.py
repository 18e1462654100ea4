"""The buffered-read paho client receives exactly what stock paho receives (real mosquitto)."""

from __future__ import annotations

import threading

from iotwatch.clients.mqtt import BufferedReadClient, make_client
from iotwatch.settings import Settings


def _receive(settings: Settings, topic: str, payloads: list[bytes], buffered: bool) -> list[bytes]:
    got: list[bytes] = []
    done, subscribed = threading.Event(), threading.Event()

    def on_message(_c: object, _u: object, message: object) -> None:
        got.append(message.payload)  # type: ignore[attr-defined]
        if len(got) == len(payloads):
            done.set()

    sub = make_client(settings.mqtt, protocol="5", buffered_reads=buffered)
    assert isinstance(sub, BufferedReadClient) == buffered
    sub.on_message = on_message
    sub.on_subscribe = lambda *_: subscribed.set()
    sub.connect(settings.mqtt.host, settings.mqtt.port)
    sub.loop_start()
    sub.subscribe(topic, qos=1)
    assert subscribed.wait(10)
    pub = make_client(settings.mqtt)
    pub.max_queued_messages_set(0)
    pub.connect(settings.mqtt.host, settings.mqtt.port)
    pub.loop_start()
    for payload in payloads:
        info = pub.publish(topic, payload, qos=1)
    info.wait_for_publish(30)
    pub.disconnect()
    pub.loop_stop()
    done.wait(60)
    sub.disconnect()
    sub.loop_stop()
    return got


def test_buffered_reads_deliver_the_same_messages_as_stock_paho(stack_settings: Settings, unique: str) -> None:
    # Many small packets (several per read), one larger than the 64 KiB read, one of 2 MB,
    # an empty one, and lengths around the 1-, 2- and 3-byte remaining-length boundaries.
    payloads = [b"%d" % i for i in range(3000)] + [b"x" * 100_000, b"y" * 2_000_000, b""]
    payloads += [bytes([i % 251]) * n for i, n in enumerate((120, 127, 128, 16_380, 16_383, 16_384, 65_530, 65_536))]
    stock = _receive(stack_settings, f"test/{unique}/stock", payloads, buffered=False)
    buffered = _receive(stack_settings, f"test/{unique}/buffered", payloads, buffered=True)
    assert stock == payloads
    assert buffered == payloads


def test_ack_many_writes_the_bytes_of_paho_pubacks() -> None:
    import struct

    import paho.mqtt.client as paho

    from iotwatch.clients.mqtt import _PUBACK_HEADER

    mids = [1, 2, 300, 65535]
    batched = struct.pack(f"!{len(mids)}I", *(_PUBACK_HEADER | mid for mid in mids))
    assert batched == b"".join(struct.pack("!BBH", paho.PUBACK, 2, mid) for mid in mids)
