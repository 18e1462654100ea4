"""No single input stops the gateway: a poison corpus through real mosquitto
(published with the third-party mosquitto_pub and with paho) and then valid traffic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from iotwatch.clients.mqtt import make_client
from iotwatch.contract.dead_letters import H_ORIGINAL_BYTES, H_ORIGINAL_SHA256, H_REASON, header_value
from iotwatch.contract.device_topics import telemetry_topic
from iotwatch.gateway.bridge import Gateway
from iotwatch.settings import Settings
from tests.helpers import assert_no_loss, read_all_seqs, read_topic, reading, seqs_by_device
from tests.support.corpus import body, corpus, publish


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
    running_gateway: Gateway, test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    cases = corpus(unique)
    mqtt = test_settings.mqtt
    client = make_client(mqtt, f"poison-{unique}")
    client.connect(mqtt.host, mqtt.port)
    client.loop_start()
    publish(client, mqtt, cases, tmp_path)
    _hundred_valid_readings_arrive(client, test_settings, f"ok-{unique}")
    dead_expected = [c for c in cases if c[3] != "forwarded"]
    dead = read_topic(test_settings.kafka, test_settings.topics.dlq, expected=len(dead_expected), timeout_s=30)
    reasons = {(m.key() or b"").decode(): header_value(m.headers(), H_REASON) for m in dead}
    for name, topic, _payload, expected in dead_expected:
        assert reasons.get(topic.split("/")[3]) == expected, name
    oversize = next(m for m in dead if header_value(m.headers(), H_REASON) == "too_large")
    big = next(c[2] for c in cases if c[0] == "2mb")
    assert len(oversize.value()) == test_settings.gateway.dead_letter_excerpt_bytes
    assert header_value(oversize.headers(), H_ORIGINAL_BYTES) == str(len(big))
    assert header_value(oversize.headers(), H_ORIGINAL_SHA256)
    forwarded = seqs_by_device(read_topic(test_settings.kafka, test_settings.topics.raw, timeout_s=20, idle_s=2))
    for name, topic, _payload, expected in cases:
        if expected == "forwarded":
            assert topic.split("/")[3] in forwarded, name
    snapshot = running_gateway.report()
    assert snapshot["inflight"] == 0 and running_gateway.health()[0]
    assert snapshot["received"] == len(cases) + 100
    assert snapshot["dead_lettered"] == len(dead_expected)


def test_a_record_kafka_refuses_becomes_a_bounded_dead_letter_and_traffic_goes_on(
    test_settings: Settings, unique: str
) -> None:
    """With the gateway's own limit raised above Kafka's (1 MB), a 2 MB reading passes the
    contract and librdkafka refuses it synchronously: the gateway dead-letters it instead of
    recreating the producer and stalling everything behind it."""
    from iotwatch.clients.kafka import ensure_topics
    from tests.support.gateway import gateway_settings

    settings = gateway_settings(test_settings, unique, max_payload_bytes=4 * 1024 * 1024)
    ensure_topics(settings.kafka, [settings.topics.raw, settings.topics.dlq])
    bridge = Gateway(settings)
    bridge.start()
    try:
        big_device, device = f"huge-{unique}", f"after-{unique}"
        big = json.dumps(body(big_device, event_data={"pad": "x" * (2 * 1024 * 1024)})).encode()
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
