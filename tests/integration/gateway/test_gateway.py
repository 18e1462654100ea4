"""The gateway against real mosquitto and Apache Kafka."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from iotwatch.application.stack.kafka_broker import restart_kafka_node, start_kafka_broker
from iotwatch.application.stack.process import free_port, stop_process
from iotwatch.clients.kafka import ensure_topics
from iotwatch.clients.mqtt import make_client
from iotwatch.contract.dead_letters import H_ORIGINAL_BYTES, H_REASON, header_value
from iotwatch.contract.device_topics import telemetry_topic
from iotwatch.gateway.bridge import Gateway
from iotwatch.gateway.metrics import wait_healthy
from iotwatch.settings import Settings
from tests.helpers import Publisher, assert_no_loss, read_all_seqs, read_topic, reading, seqs_by_device, user_env
from tests.support.gateway import gateway_settings


def test_every_message_arrives_once_in_seq_order_per_device(
    running_gateway: Gateway, test_settings: Settings, unique: str
) -> None:
    devices = [f"dev-{unique}-{i}" for i in range(6)]
    Publisher(test_settings.mqtt, devices, count=150).start().join()
    records = read_topic(test_settings.kafka, test_settings.topics.raw, expected=900, timeout_s=60)
    time.sleep(1.0)
    records += read_topic(test_settings.kafka, test_settings.topics.raw, timeout_s=5, idle_s=1.0)[len(records) :]
    assert seqs_by_device(records) == {d: list(range(150)) for d in devices}
    # Keyed by device id, with the MQTT topic and ingest time in headers.
    first = records[0]
    body = json.loads(first.value())
    assert first.key().decode() == body["device_id"]
    headers = dict(first.headers())
    assert headers["mqtt.topic"].decode() == telemetry_topic("home-1", "thermostat", body["device_id"])
    assert headers["mqtt.qos"] == b"1" and int(headers["iotwatch.ingest_ms"]) > 0

    snapshot = running_gateway.report()
    assert snapshot["received"] == snapshot["forwarded"] == 900
    assert snapshot["inflight"] == 0 and snapshot["dead_lettered"] == 0 and snapshot["duplicates"] == 0
    metrics = requests.get(f"http://127.0.0.1:{running_gateway.metrics_port}/metrics", timeout=5).text
    assert f'iotwatch_gateway_forwarded_total{{instance="gw-{unique}"}} 900.0' in metrics
    assert "iotwatch_gateway_delivery_latency_seconds_bucket" in metrics
    health = requests.get(f"http://127.0.0.1:{running_gateway.metrics_port}/health", timeout=5)
    assert health.status_code == 200


MALFORMED: list[tuple[str, bytes]] = [
    ("invalid_json", b"{not json"),
    ("invalid_json", b""),
    ("invalid_json", b"\x00\x01\x02"),
    ("invalid_utf8", b'{"v":1,"device_id":"\xff\xfe"}'),
    ("not_an_object", b"[1,2,3]"),
    ("not_an_object", b'"just a string"'),
    ("not_an_object", b"42"),
    ("missing_field", b'{"v":1}'),
    (
        "missing_field",
        b'{"v":1,"device_id":"d","device_type":"thermostat","site":"home-1","ts":1763784000000,"metrics":{}}',
    ),
    (
        "invalid_field",
        b'{"v":1,"device_id":"d","device_type":"thermostat","site":"home-1","seq":"7","ts":1763784000000,"metrics":{}}',
    ),
    (
        "invalid_field",
        b'{"v":1,"device_id":"d","device_type":"thermostat","site":"home-1","seq":-1,"ts":1763784000000,"metrics":{}}',
    ),
    (
        "invalid_field",
        b'{"v":1,"device_id":"d","device_type":"thermostat","site":"home-1","seq":1.5,"ts":1763784000000,"metrics":{}}',
    ),
    (
        "invalid_field",
        b'{"v":1,"device_id":"d","device_type":"thermostat","site":"home-1","seq":1,"ts":1763784000000,"metrics":{"t":"hot"}}',
    ),
    (
        "invalid_field",
        b'{"v":1,"device_id":"d","device_type":"thermostat","site":"home-1","seq":1,"ts":1763784000000,"metrics":{"t":true}}',
    ),
    (
        "invalid_field",
        b'{"v":1,"device_id":"d","device_type":"thermostat","site":"home-1","seq":1,"ts":1763784000000,"metrics":[1]}',
    ),
    (
        "invalid_field",
        b'{"v":1,"device_id":"bad id/with slash","device_type":"thermostat","site":"home-1","seq":1,'
        b'"ts":1763784000000,"metrics":{}}',
    ),
    (
        "non_finite_number",
        b'{"v":1,"device_id":"d","device_type":"thermostat","site":"home-1","seq":1,"ts":1763784000000,"metrics":{"t":NaN}}',
    ),
    (
        "non_finite_number",
        b'{"v":1,"device_id":"d","device_type":"thermostat","site":"home-1","seq":1,"ts":1763784000000,"metrics":{"t":Infinity}}',
    ),
    (
        "non_finite_number",
        b'{"v":1,"device_id":"d","device_type":"thermostat","site":"home-1","seq":1,"ts":1763784000000,"metrics":{"t":1e999}}',
    ),
    (
        "ts_in_future",
        b'{"v":1,"device_id":"d","device_type":"thermostat","site":"home-1","seq":1,"ts":4102444800000,"metrics":{}}',
    ),
    (
        "ts_too_old",
        b'{"v":1,"device_id":"d","device_type":"thermostat","site":"home-1","seq":1,"ts":1000,"metrics":{}}',
    ),
    (
        "unsupported_version",
        b'{"v":99,"device_id":"d","device_type":"thermostat","site":"home-1","seq":1,"ts":1763784000000,"metrics":{}}',
    ),
    (
        "unknown_field",
        b'{"v":1,"device_id":"d","device_type":"thermostat","site":"home-1","seq":1,"ts":1763784000000,"metrics":{},"sequence":1}',
    ),
    ("too_large", b'{"v":1,"pad":"' + b"x" * 300_000 + b'"}'),
    (
        "topic_mismatch",
        b'{"v":1,"device_id":"someone-else","device_type":"thermostat","site":"home-1","seq":1,"ts":1763784000000,"metrics":{}}',
    ),
]


def test_malformed_inputs_are_dead_lettered_with_reasons_and_valid_traffic_is_unaffected(
    running_gateway: Gateway, test_settings: Settings, unique: str
) -> None:
    device = f"bad-{unique}"
    topic = telemetry_topic("home-1", "thermostat", "d")
    client = make_client(test_settings.mqtt, f"pub-{unique}")
    client.connect(test_settings.mqtt.host, test_settings.mqtt.port)
    client.loop_start()
    valid_topic = telemetry_topic("home-1", "thermostat", device)
    for seq, (_reason, payload) in enumerate(MALFORMED):
        client.publish(valid_topic, reading(device, seq).to_json(), qos=1)
        target = valid_topic if _reason == "topic_mismatch" else topic
        client.publish(target, payload, qos=1).wait_for_publish(10)
    client.publish("iot/only/three", reading(device, 999).to_json(), qos=1)  # matches no rule: not subscribed
    client.disconnect()
    client.loop_stop()

    dead = read_topic(test_settings.kafka, test_settings.topics.dlq, expected=len(MALFORMED), timeout_s=30)
    assert len(MALFORMED) >= 20 and len(dead) == len(MALFORMED)
    by_payload = {bytes(m.value() or b""): header_value(m.headers(), H_REASON) for m in dead}
    excerpt = test_settings.gateway.dead_letter_excerpt_bytes
    for reason, payload in MALFORMED:
        carried = payload if len(payload) <= test_settings.gateway.max_payload_bytes else payload[:excerpt]
        assert by_payload[carried] == reason, payload[:80]
    oversize = next(m for m in dead if header_value(m.headers(), H_REASON) == "too_large")
    assert header_value(oversize.headers(), H_ORIGINAL_BYTES) == str(
        len(next(p for r, p in MALFORMED if r == "too_large"))
    )
    assert all(header_value(m.headers(), "iotwatch.detail") for m in dead)
    valid = read_topic(test_settings.kafka, test_settings.topics.raw, expected=len(MALFORMED), timeout_s=30)
    assert seqs_by_device(valid) == {device: list(range(len(MALFORMED)))}
    assert running_gateway.health()[0]


def _gateway_command(settings: Settings, client_id: str, metrics_port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "iotwatch.application",
        "gateway",
        "--mqtt",
        settings.mqtt.url,
        "--kafka",
        settings.kafka.bootstrap_servers,
        "--influx",
        "",
        "--client-id",
        client_id,
        "--metrics-port",
        str(metrics_port),
        "--json",
    ]


def _gateway_env(settings: Settings) -> dict[str, str]:
    env = user_env()
    env.update(
        IOTWATCH_TOPIC_RAW=settings.topics.raw,
        IOTWATCH_TOPIC_DLQ=settings.topics.dlq,
        IOTWATCH_GATEWAY_STATUS_INTERVAL_S="1",
    )
    return env


def test_kill_minus_nine_and_restart_loses_nothing(test_settings: Settings, unique: str, tmp_path: Path) -> None:
    ensure_topics(test_settings.kafka, [test_settings.topics.raw, test_settings.topics.dlq])
    port = free_port()
    command = _gateway_command(test_settings, f"gw-{unique}", port)
    env = _gateway_env(test_settings)
    log = open(tmp_path / "gateway.log", "wb")
    first = subprocess.Popen(command, env=env, stdout=log, stderr=log)
    wait_healthy(port)
    devices = [f"k9-{unique}-{i}" for i in range(4)]
    publisher = Publisher(test_settings.mqtt, devices, count=1500, rate_per_s=1500).start()
    time.sleep(1.5)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    time.sleep(1.0)  # the broker queues for the persistent session meanwhile
    second = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=log)
    publisher.join()
    expected = 1500 * len(devices)
    records, seqs = read_all_seqs(test_settings.kafka, test_settings.topics.raw, devices, 1500)
    second.send_signal(signal.SIGTERM)
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 0
    assert_no_loss(seqs, devices, 1500)
    duplicates = len(records) - expected
    summary = json.loads(out)
    assert summary["inflight"] == 0
    # Redelivered after the kill (allowed, removed downstream by (device_id, seq)): at most what
    # the killed gateway held unacknowledged, since the broker redelivers only those.
    assert 0 <= duplicates <= test_settings.gateway.max_inflight, duplicates


def test_kafka_outage_then_recovery_no_gap_and_nothing_acknowledged_undelivered(
    stack_settings: Settings, unique: str, tmp_path: Path
) -> None:
    kafka_service = start_kafka_broker(tmp_path / "kafka-run", timeout_s=30)
    kafka = stack_settings.kafka.model_copy(update={"bootstrap_servers": kafka_service.endpoint})
    settings = gateway_settings(
        stack_settings.model_copy(update={"kafka": kafka}), unique, max_inflight=200, stall_timeout_s=5.0
    )
    ensure_topics(kafka, [settings.topics.raw, settings.topics.dlq])
    bridge = Gateway(settings)
    bridge.start()
    devices = [f"out-{unique}-{i}" for i in range(3)]
    publisher = Publisher(settings.mqtt, devices, count=1000, rate_per_s=150).start()
    health_seen: list[bool] = []
    try:
        time.sleep(3)
        stop_process(kafka_service.process)
        outage_started = time.time()
        for _ in range(10):
            time.sleep(1)
            health_seen.append(bridge.health()[0])
        snapshot_during = bridge.refresh_gauges()
        scraped = requests.get(f"http://127.0.0.1:{bridge.metrics_port}/metrics", timeout=5).text
        kafka_service = restart_kafka_node(kafka_service, timeout_s=60)  # same port, same log
        publisher.join(timeout=60)
        deadline = time.monotonic() + 60
        while bridge.stats.inflight and time.monotonic() < deadline:
            time.sleep(0.5)
        records = read_topic(kafka, settings.topics.raw, timeout_s=60, idle_s=3)
        summary = bridge.stop()
    finally:
        stop_process(kafka_service.process)
    assert not all(health_seen), "health must report the outage"
    assert snapshot_during["kafka_up"] is False and snapshot_during["inflight"] > 0
    assert snapshot_during["inflight"] <= 200  # bounded: the broker holds the rest
    # a scrape reads the gauges as of now (no status period ran): both ages show the outage
    gauges = {
        family.name: family.samples[0].value
        for family in text_string_to_metric_families(scraped)
        if family.type == "gauge" and family.samples
    }
    assert gauges["iotwatch_gateway_oldest_inflight_seconds"] > 5
    assert gauges["iotwatch_gateway_newest_reading_age_seconds"] > 5  # the MQTT broker holds the backlog
    assert summary["inflight"] == 0
    seqs = seqs_by_device(records)
    for device in devices:
        got = sorted(set(seqs[device]))
        first_during_outage = next(seq for seq, t in publisher.published[device] if t >= outage_started)
        assert got[0] <= first_during_outage, "something published during the outage was acknowledged, not delivered"
        assert got == list(range(got[0], 1000)), "gap after recovery"


def test_shared_subscription_splits_load_between_instances(test_settings: Settings, unique: str) -> None:
    ensure_topics(test_settings.kafka, [test_settings.topics.raw, test_settings.topics.dlq])
    bridges = [Gateway(gateway_settings(test_settings, f"{unique}-{i}", shared_group=f"g-{unique}")) for i in range(2)]
    for bridge in bridges:
        bridge.start()
    devices = [f"sh-{unique}-{i}" for i in range(4)]
    Publisher(test_settings.mqtt, devices, count=200).start().join()
    records = read_topic(test_settings.kafka, test_settings.topics.raw, expected=800, timeout_s=60)
    summaries = [bridge.stop() for bridge in bridges]
    assert {d: sorted(s) for d, s in seqs_by_device(records).items()} == {d: list(range(200)) for d in devices}
    assert all(s["received"] > 0 for s in summaries)
    assert sum(s["forwarded"] for s in summaries) == 800
