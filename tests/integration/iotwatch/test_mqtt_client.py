"""The buffered-read and batch-publishing paho clients against stock paho (real mosquitto)."""

from __future__ import annotations

import threading
import time
from typing import Any, Literal

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from iotwatch.clients.batch_publish import BatchPublishClient
from iotwatch.clients.mqtt import BufferedReadClient, make_client
from iotwatch.settings import Settings

# Many small packets (several per read), one larger than the 64 KiB read, one of 2 MB,
# an empty one, and lengths around the 1-, 2- and 3-byte remaining-length boundaries.
PAYLOADS = [b"%d" % i for i in range(3000)] + [b"x" * 100_000, b"y" * 2_000_000, b""]
PAYLOADS += [bytes([i % 251]) * n for i, n in enumerate((120, 127, 128, 16_380, 16_383, 16_384, 65_530, 65_536))]


def _subscriber(settings: Settings, topic: str, expected: int, buffered: bool) -> tuple[Any, list[bytes], Any]:
    """A subscribed MQTT 5 client, the payloads it gets, and an event set at ``expected``."""
    got: list[bytes] = []
    done, subscribed = threading.Event(), threading.Event()

    def on_message(_c: object, _u: object, message: object) -> None:
        got.append(message.payload)  # type: ignore[attr-defined]
        if len(got) == expected:
            done.set()

    sub = make_client(settings.mqtt, protocol="5", buffered_reads=buffered)
    assert isinstance(sub, BufferedReadClient) == buffered
    sub.on_message = on_message
    sub.on_subscribe = lambda *_: subscribed.set()
    sub.connect(settings.mqtt.host, settings.mqtt.port)
    sub.loop_start()
    sub.subscribe(topic, qos=1)
    assert subscribed.wait(10)
    return sub, got, done


def _stop(client: Any) -> None:
    client.disconnect()
    client.loop_stop()


def _receive(settings: Settings, topic: str, payloads: list[bytes], buffered: bool) -> list[bytes]:
    sub, got, done = _subscriber(settings, topic, len(payloads), buffered)
    pub = make_client(settings.mqtt)
    pub.max_queued_messages_set(0)
    pub.connect(settings.mqtt.host, settings.mqtt.port)
    pub.loop_start()
    for payload in payloads:
        info = pub.publish(topic, payload, qos=1)
    info.wait_for_publish(30)
    _stop(pub)
    done.wait(60)
    _stop(sub)
    return got


def test_buffered_reads_deliver_the_same_messages_as_stock_paho(stack_settings: Settings, unique: str) -> None:
    stock = _receive(stack_settings, f"test/{unique}/stock", PAYLOADS, buffered=False)
    buffered = _receive(stack_settings, f"test/{unique}/buffered", PAYLOADS, buffered=True)
    assert stock == PAYLOADS
    assert buffered == PAYLOADS


def _fields(settings: Settings, topic: str, protocol: Literal["3.1.1", "5"], buffered: bool) -> list[tuple[Any, ...]]:
    """What ``on_message`` gets for a retained message, QoS 0, 1 and 2, and (MQTT 5) one with
    user properties, through a stock or a buffered-read client."""
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = ("k", "v")
    publications = [("q0", b"a", 0, None), ("q1", b"b", 1, None), ("q2", b"c", 2, None)]
    if protocol == "5":
        publications.append(("props", b"d", 1, props))
    got: list[Any] = []
    done, subscribed = threading.Event(), threading.Event()

    def on_message(_c: object, _u: object, message: Any) -> None:
        got.append(message)
        if len(got) == len(publications) + 1:
            done.set()

    pub = make_client(settings.mqtt, protocol=protocol)
    pub.connect(settings.mqtt.host, settings.mqtt.port)
    pub.loop_start()
    pub.publish(f"{topic}/retained", b"r", qos=1, retain=True).wait_for_publish(10)
    sub = make_client(settings.mqtt, protocol=protocol, buffered_reads=buffered)
    sub.on_message = on_message
    sub.on_subscribe = lambda *_: subscribed.set()
    sub.connect(settings.mqtt.host, settings.mqtt.port)
    sub.loop_start()
    sub.subscribe(f"{topic}/#", qos=2)
    assert subscribed.wait(10)
    for suffix, payload, qos, properties in publications:
        pub.publish(f"{topic}/{suffix}", payload, qos=qos, properties=properties).wait_for_publish(10)
    done.wait(10)
    _stop(sub)
    pub.publish(f"{topic}/retained", b"", qos=1, retain=True).wait_for_publish(10)  # clears it
    _stop(pub)
    short_path = [m.info is None for m in got]  # the buffered client's own decoding
    return sorted(  # QoS 2 reaches on_message at PUBREL: after a later QoS 1 one at times
        (
            m.topic.rsplit("/", 1)[1],
            m.payload,
            type(m.payload),
            m.qos,
            m.retain,
            m.dup,
            m.mid > 0 if m.qos else m.mid,
            getattr(m.properties, "UserProperty", None),
            short,
        )
        for m, short in zip(got, short_path, strict=True)
    )


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_buffered_client_gives_on_message_what_stock_paho_gives(
    stack_settings: Settings, unique: str, protocol: Literal["3.1.1", "5"]
) -> None:
    stock = _fields(stack_settings, f"test/{unique}/stock", protocol, buffered=False)
    buffered = _fields(stack_settings, f"test/{unique}/buffered", protocol, buffered=True)
    assert [f[:-1] for f in buffered] == [f[:-1] for f in stock]
    assert not any(f[-1] for f in stock)
    # QoS 0 and 1 without properties (retained too) take the short path, the rest paho's
    assert [f[0] for f in buffered if f[-1]] == ["q0", "q1", "retained"]
    assert ("retained", b"r", bytes, 1, True, False, True, None) in [f[:-1] for f in buffered]
    if protocol == "5":
        assert ("props", b"d", bytes, 1, False, False, True, [("k", "v")]) in [f[:-1] for f in buffered]


@pytest.mark.parametrize(("protocol", "qos"), [("3.1.1", 0), ("3.1.1", 1), ("5", 1)])
def test_batch_publish_delivers_every_message_in_order(
    stack_settings: Settings, unique: str, protocol: str, qos: int
) -> None:
    """The packets the batch client builds are read by mosquitto as paho's are: every payload
    arrives, in order, byte for byte; at QoS 1 the window holds and every reading is acked
    and timed (retained ones are not timed)."""
    topic = f"test/{unique}/batch"
    payloads = PAYLOADS if qos else PAYLOADS[:3000]  # QoS 0: no flow control, keep it small
    sub, got, done = _subscriber(stack_settings, topic, len(payloads) + 1, buffered=True)
    connected = threading.Event()
    pub = make_client(stack_settings.mqtt, f"batch-{unique}", protocol=protocol, client_class=BatchPublishClient)
    assert isinstance(pub, BatchPublishClient)
    pub.window = 50
    pub.on_connect = lambda *_: connected.set()
    pub.connect(stack_settings.mqtt.host, stack_settings.mqtt.port)
    pub.loop_start()
    assert connected.wait(10)
    in_flight = taken = 0

    def watch() -> None:
        nonlocal in_flight, taken
        while not done.is_set():
            in_flight, taken = max(in_flight, len(pub.unacked)), max(taken, pub.pending)
            done.wait(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    messages = [(topic, p, False) for p in payloads] + [(topic, "retained status", True)]
    assert pub.publish_many(messages[:1000], qos) == 1000
    assert pub.publish_many(messages[1000:], qos) == len(messages) - 1000
    done.wait(60)
    watcher.join()
    deadline = time.monotonic() + 10
    while pub.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    _stop(sub)
    _stop(pub)
    assert got == [*payloads, b"retained status"]
    if qos:
        assert in_flight <= 50 and taken <= 100  # the window, and as many again waiting
        assert pub.acked == pub.published == len(messages) and not pub.unacked and pub.refused == 0
        assert len(pub.latencies_ms) == len(payloads)
