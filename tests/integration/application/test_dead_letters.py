"""``iotwatch deadletters``: dead letters the real gateway wrote, read back by reason and device,
shown with an excerpt, and replayed once the cause is gone; a record replayed twice comes
through the streaming engine once (its (device_id, seq) dedupe)."""

from __future__ import annotations

import json
import time
from typing import Any

from click.testing import CliRunner

from iotwatch.application.cli import cli
from iotwatch.application.dead_letters import H_REPLAY_OF
from iotwatch.clients.kafka import ensure_topics
from iotwatch.clients.mqtt import make_client
from iotwatch.contract.device_topics import telemetry_topic
from iotwatch.gateway.bridge import Gateway
from iotwatch.settings import Settings, StreamSettings
from iotwatch.streaming.engine import PartitionEngine
from iotwatch.streaming.partition_io import RecordColumns
from iotwatch.streaming.state_store import MemoryStore
from tests.helpers import read_topic
from tests.support.gateway import gateway_settings


def run(settings: Settings, *args: str) -> Any:
    env = {"IOTWATCH_TOPIC_DLQ": settings.topics.dlq, "IOTWATCH_TOPIC_RAW": settings.topics.raw}
    argv = ["deadletters", args[0], "--kafka", settings.kafka.bootstrap_servers, *args[1:], "--json"]
    result = CliRunner().invoke(cli, argv, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def payload(device: str, seq: int, ts: int, **metrics: float) -> bytes:
    body = {"v": 1, "device_id": device, "device_type": "thermostat", "site": "home-1", "seq": seq, "ts": ts}
    return json.dumps({**body, "metrics": metrics or {"temperature_c": 21.0}}).encode()


def test_list_show_and_replay_a_fixed_record_that_then_comes_through_once(test_settings: Settings, unique: str) -> None:
    # a gateway that allows 2 s of device clock skew: a reading 6 s ahead is dead-lettered now,
    # and valid once its time has come (the cause fixed)
    settings = gateway_settings(test_settings, unique, max_future_skew_ms=2000)
    ensure_topics(settings.kafka, [settings.topics.raw, settings.topics.dlq])
    bridge = Gateway(settings)
    bridge.start()
    device, meter = f"th-{unique}", f"odd-{unique}"
    now = int(time.time() * 1000)
    ahead_ts = now + 6000
    client = make_client(settings.mqtt, f"pub-{unique}")
    client.connect(settings.mqtt.host, settings.mqtt.port)
    client.loop_start()
    try:
        topic = telemetry_topic("home-1", "thermostat", device)
        for seq in range(3):
            client.publish(topic, payload(device, seq, now - 3000 + seq * 1000), qos=1).wait_for_publish(10)
        client.publish(topic, payload(device, 3, ahead_ts), qos=1).wait_for_publish(10)
        odd_topic = telemetry_topic("home-1", "thermostat", meter)
        foreign = payload(meter, 0, now, temperature_c=21.0, power_w=800.0)
        client.publish(odd_topic, foreign, qos=1).wait_for_publish(10)
        client.publish(odd_topic, b"{not json", qos=1).wait_for_publish(10)
        read_topic(settings.kafka, settings.topics.dlq, expected=3, timeout_s=30)
    finally:
        client.loop_stop()
        client.disconnect()
        summary = bridge.stop()
    assert summary["received"] == summary["forwarded"] + summary["dead_lettered"] == 6

    listed = run(settings, "list")
    groups = {(g["reason"], g["device"]): g["count"] for g in listed["groups"]}
    assert groups == {("ts_in_future", device): 1, ("unknown_metric", meter): 1, ("invalid_json", meter): 1}
    assert (listed["dead_letters"], listed["total"], listed["truncated"]) == (3, 3, False)
    cut = run(settings, "list", "--limit", "1")
    assert (cut["shown"], cut["total"], cut["truncated"]) == (1, 3, True)

    shown = run(settings, "show", "--device", meter, "--reason", "unknown_metric")["dead_letters"]
    assert len(shown) == 1 and "power_w" in shown[0]["excerpt"] and shown[0]["stage"] == "gateway"
    assert "a thermostat has no power_w" in shown[0]["detail"]
    future_id = run(settings, "show", "--reason", "ts_in_future")["dead_letters"][0]["id"]

    # still refused: nothing is sent
    refused = run(settings, "replay", "--device", meter)
    assert refused["replayed"] == 0 and refused["still_invalid_reasons"] == {"unknown_metric": 1, "invalid_json": 1}
    time.sleep(max(0.0, (ahead_ts - time.time() * 1000) / 1000) + 0.5)
    assert run(settings, "replay", future_id)["replayed_ids"] == [future_id]
    assert run(settings, "replay", "--reason", "ts_in_future")["replayed"] == 1  # again, by mistake

    records = read_topic(settings.kafka, settings.topics.raw, expected=5, timeout_s=30)
    replayed = [m for m in records if dict(m.headers() or []).get(H_REPLAY_OF)]
    assert len(records) == 5 and len(replayed) == 2
    assert all(m.key() == device.encode() and json.loads(m.value())["seq"] == 3 for m in replayed)

    # the streaming engine (what each Spark task runs) over the raw topic: seq 3 once
    engine = PartitionEngine(StreamSettings())
    store = MemoryStore(engine.state_sizes, engine.seq_words)
    columns = RecordColumns.from_payloads(
        0,
        [m.value() for m in records],
        [m.key().decode() for m in records],
        list(range(len(records))),
        [m.timestamp()[1] for m in records],
    )
    rows = engine.process(store, columns, int(time.time() * 1000)).rows()
    seqs = [r["seq"] for r in rows if r["kind"] == "reading"]
    assert sorted(seqs) == [0, 1, 2, 3]
    assert store.load(device).counters()["duplicates"] == 1
