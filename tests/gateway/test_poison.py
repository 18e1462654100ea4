"""No single input stops the gateway (issue 12): a poison corpus through real mosquitto
(published with the third-party mosquitto_pub and with paho) and then valid traffic."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from gateway.bridge import Gateway
from iotwatch.clients.mqtt import make_client
from iotwatch.contract import MAX_SEQ, telemetry_topic
from iotwatch.deadletter import H_ORIGINAL_BYTES, H_ORIGINAL_SHA256, H_REASON, header_value
from iotwatch.settings import Settings
from tests.helpers import assert_no_loss, read_all_seqs, read_topic, reading, seqs_by_device


def _body(device: str, site: str = "poison", device_type: str = "thermostat", **fields: object) -> dict[str, object]:
    body: dict[str, object] = {"v": 1, "device_id": device, "device_type": device_type, "site": site, "seq": 0,
                               "ts": int(time.time() * 1000), "metrics": {"temperature_c": 21.0}}
    body.update(fields)
    return body


def _corpus(unique: str) -> list[tuple[str, str, bytes, str]]:
    """(name, MQTT topic, payload, expected): a dead-letter reason, or ``forwarded`` where the
    contract lets it through for the streaming job to judge (documented in the README)."""
    def case(name: str, expected: str, device_type: str = "thermostat", site: str = "poison",
             **fields: object) -> tuple[str, str, bytes, str]:
        device = f"p-{name}-{unique}"
        return (name, telemetry_topic(site, device_type, device),
                json.dumps(_body(device, site, device_type, **fields)).encode(), expected)

    deep_device = f"p-deep-{unique}"
    deep = json.dumps(_body(deep_device))[:-1].encode() + b',"event_data":{"x":' + b"[" * 50_000 + b"]" * 50_000 + b"}}"
    big_device = f"p-big-{unique}"
    big = json.dumps(_body(big_device, event_data={"pad": "x" * (2 * 1024 * 1024)})).encode()
    conflict = f"p-conflict-{unique}"
    return [
        case("seq-2-63", "invalid_field", seq=MAX_SEQ + 1),
        case("seq-minus-1", "invalid_field", seq=-1),
        case("colon-type", "invalid_field", device_type="a:b"),
        case("metrics-1000", "too_many_metrics", metrics={f"m{i}": float(i) for i in range(1000)}),
        case("future-23h", "forwarded", ts=int(time.time() * 1000) + 23 * 3600 * 1000),
        case("future-25h", "ts_in_future", ts=int(time.time() * 1000) + 25 * 3600 * 1000),
        case("nan", "non_finite_number", metrics={"temperature_c": float("nan")}),
        ("deep-nesting", telemetry_topic("poison", "thermostat", deep_device), deep, "invalid_json"),
        ("2mb", telemetry_topic("poison", "thermostat", big_device), big, "too_large"),
        ("binary", telemetry_topic("poison", "thermostat", f"p-binary-{unique}"), b"\x00\xff{{{", "invalid_utf8"),
        ("not-json", telemetry_topic("poison", "thermostat", f"p-garbage-{unique}"), b"{not json", "invalid_json"),
        # The same device id under a second site: the gateway cannot know, the job judges it.
        (("identity-a", telemetry_topic("site-a", "thermostat", conflict),
          json.dumps(_body(conflict, "site-a")).encode(), "forwarded")),
        (("identity-b", telemetry_topic("site-b", "thermostat", conflict),
          json.dumps(_body(conflict, "site-b")).encode(), "forwarded")),
    ]


def _hundred_valid_readings_arrive(client: Any, settings: Settings, device: str) -> None:
    """Publish 100 valid readings of ``device`` after the poison, close ``client``, and check
    that every one reached the raw topic."""
    for seq in range(100):
        info = client.publish(telemetry_topic("home-1", "thermostat", device), reading(device, seq).to_json(), qos=1)
    info.wait_for_publish(30)
    client.disconnect()
    client.loop_stop()
    _records, seqs = read_all_seqs(settings.kafka, settings.topics.raw, [device], 100, timeout_s=60)
    assert_no_loss(seqs, [device], 100)


def test_poison_corpus_then_valid_readings_nothing_stops_the_gateway(
        running_gateway: Gateway, test_settings: Settings, unique: str, tmp_path: Path) -> None:
    corpus = _corpus(unique)
    mosquitto_pub = shutil.which("mosquitto_pub")
    assert mosquitto_pub, "mosquitto_pub (Debian mosquitto-clients) is required"
    mqtt = test_settings.mqtt
    client = make_client(mqtt, f"poison-{unique}")
    client.connect(mqtt.host, mqtt.port)
    client.loop_start()
    for index, (name, topic, payload, _expected) in enumerate(corpus):
        if index % 2:  # half through a third-party client, the payload from a file
            path = tmp_path / name
            path.write_bytes(payload)
            subprocess.run([mosquitto_pub, "-h", mqtt.host, "-p", str(mqtt.port), "-q", "1", "-t", topic,
                            "-f", str(path)], check=True, timeout=30)
        else:
            client.publish(topic, payload, qos=1).wait_for_publish(30)
    _hundred_valid_readings_arrive(client, test_settings, f"ok-{unique}")
    dead_expected = [c for c in corpus if c[3] != "forwarded"]
    dead = read_topic(test_settings.kafka, test_settings.topics.dlq, expected=len(dead_expected), timeout_s=30)
    reasons = {(m.key() or b"").decode(): header_value(m.headers(), H_REASON) for m in dead}
    for name, topic, payload, expected in dead_expected:
        assert reasons.get(topic.split("/")[3]) == expected, name
    oversize = next(m for m in dead if header_value(m.headers(), H_REASON) == "too_large")
    big = next(c[2] for c in corpus if c[0] == "2mb")
    assert len(oversize.value()) == test_settings.gateway.dead_letter_excerpt_bytes
    assert header_value(oversize.headers(), H_ORIGINAL_BYTES) == str(len(big))
    assert header_value(oversize.headers(), H_ORIGINAL_SHA256)
    forwarded = seqs_by_device(read_topic(test_settings.kafka, test_settings.topics.raw, timeout_s=20, idle_s=2))
    for name, topic, _payload, expected in corpus:
        if expected == "forwarded":
            assert topic.split("/")[3] in forwarded, name
    snapshot = running_gateway.report()
    assert snapshot["inflight"] == 0 and running_gateway.health()[0]
    assert snapshot["received"] == len(corpus) + 100
    assert snapshot["dead_lettered"] == len(dead_expected)


def test_a_record_kafka_refuses_becomes_a_bounded_dead_letter_and_traffic_goes_on(
        test_settings: Settings, unique: str) -> None:
    """With the gateway's own limit raised above Kafka's (1 MB), a 2 MB reading passes the
    contract and librdkafka refuses it synchronously: it used to recreate the producer ten
    times a second and stall everything behind it."""
    from iotwatch.clients.kafka import ensure_topics
    from tests.gateway.conftest import gateway_settings

    settings = gateway_settings(test_settings, unique, max_payload_bytes=4 * 1024 * 1024)
    ensure_topics(settings.kafka, [settings.topics.raw, settings.topics.dlq])
    bridge = Gateway(settings)
    bridge.start()
    try:
        big_device, device = f"huge-{unique}", f"after-{unique}"
        big = json.dumps(_body(big_device, event_data={"pad": "x" * (2 * 1024 * 1024)})).encode()
        client = make_client(settings.mqtt, f"refused-{unique}")
        client.connect(settings.mqtt.host, settings.mqtt.port)
        client.loop_start()
        client.publish(telemetry_topic("poison", "thermostat", big_device), big, qos=1).wait_for_publish(30)
        _hundred_valid_readings_arrive(client, settings, device)
        dead = read_topic(settings.kafka, settings.topics.dlq, expected=1, timeout_s=30)
        assert [header_value(m.headers(), H_REASON) for m in dead] == ["kafka_refused"]
        assert len(dead[0].value()) == settings.gateway.dead_letter_excerpt_bytes
        assert header_value(dead[0].headers(), H_ORIGINAL_BYTES) == str(len(big))
    finally:
        summary = bridge.stop()
    assert summary["inflight"] == 0 and summary["dead_letter_reasons"] == {"kafka_refused": 1}
