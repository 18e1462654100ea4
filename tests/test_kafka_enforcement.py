"""What a real Apache Kafka broker enforces, and that the product lives with it:

- retention: a topic past its ``retention.ms`` loses its old segments, and a reader from the
  beginning starts where the log now starts;
- compaction: the alert-state, silences and twin topics keep only the newest value per key
  once the cleaner ran, and the forwarder and the twin reader rebuild their state from that.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from alerts.actions import acknowledge, add_silence, revoke_silence
from alerts.book import load_book
from alerts.dispatch import Dispatcher
from alerts.routing import parse_routing
from devices.twin_ops import parse_assignments, read_twin, set_desired
from iotwatch.clients.kafka import (
    admin_client,
    client_config,
    read_to_end,
)
from iotwatch.contract.device_commands import TwinProperties
from iotwatch.contract.oncall import AlertState, AlertStep, Matchers, Silence, TwinRecord
from iotwatch.contract.oncall import decode as decode_record
from iotwatch.settings import AlertsSettings, KafkaSettings, Settings
from streaming import rules
from tests.alerts.conftest import make_alert, produce

#: Segments roll this often (a record arriving later starts a new one), so the cleaner and the
#: retention check, which never touch the active segment, get closed segments to work on.
SEGMENT_MS = 500
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": str(SEGMENT_MS),
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
}


def create_topic(kafka: KafkaSettings, name: str, config: dict[str, str]) -> None:
    """One partition, so one roll closes every key's segment."""
    admin = admin_client(kafka)
    for future in admin.create_topics([NewTopic(name, num_partitions=1, config=config)]).values():
        future.result(timeout=30)


def low_watermark(kafka: KafkaSettings, topic: str) -> int:
    consumer = Consumer({**client_config(kafka), "group.id": f"watermarks-{time.time_ns()}"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0])
    finally:
        consumer.close()


# --- retention ---------------------------------------------------------------------------


def test_retention_deletes_the_segments_older_than_retention_ms(test_settings: Settings, unique: str) -> None:
    kafka, topic = test_settings.kafka, f"test.{unique}.retention"
    create_topic(kafka, topic, {"retention.ms": "3000", "segment.ms": str(SEGMENT_MS)})
    producer = Producer({**client_config(kafka), "enable.idempotence": True})
    for i in range(20):
        producer.produce(topic, f"old-{i}".encode(), key=b"k")
    assert producer.flush(30) == 0
    assert low_watermark(kafka, topic) == 0

    # Fresh records keep arriving (and rolling segments) while the broker's check (every 5 s)
    # deletes what is older than 3 s.
    deadline, fresh = time.monotonic() + 40, 0
    while low_watermark(kafka, topic) < 20 and time.monotonic() < deadline:
        producer.produce(topic, f"fresh-{fresh}".encode(), key=b"k")
        fresh += 1
        assert producer.flush(30) == 0
        time.sleep(0.5)
    assert low_watermark(kafka, topic) >= 20, "the old segment was not deleted within 40 s"
    producer.produce(topic, b"newest", key=b"k")
    assert producer.flush(30) == 0

    # from the beginning: none of the old records, and no gap among the recent ones
    values = [m.value().decode() for m in read_to_end(kafka, topic)]
    first = fresh - (len(values) - 1)
    assert first >= 0 and values == [f"fresh-{i}" for i in range(first, fresh)] + ["newest"]


# --- compaction --------------------------------------------------------------------------


def compacted_settings(test_settings: Settings) -> Settings:
    """``test_settings`` whose on-call topics exist already, compacted with small segments."""
    topics = test_settings.topics
    for name in (topics.alert_state, topics.silences, topics.device_twin):
        create_topic(test_settings.kafka, name, COMPACTED)
    return test_settings


def wait_compacted(kafka: KafkaSettings, topic: str, timeout_s: float = 60) -> list[Message]:
    """The topic once it holds one record per key (the cleaner ran over its closed segments)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = read_to_end(kafka, topic)
        keys = [m.key() for m in records]
        if len(keys) == len(set(keys)):
            return records
        assert time.monotonic() < deadline, (
            f"{topic}: {len(keys)} records for {len(set(keys))} keys after {timeout_s} s"
        )
        time.sleep(1)


def test_compaction_keeps_the_newest_ack_silence_and_twin_and_restarts_rebuild_from_them(
    test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    settings = compacted_settings(test_settings)
    topics, kafka = settings.topics, settings.kafka
    alerts = [
        make_alert(f"hvac-{unique}-{i}", "thermostat", "home-1", rules.STUCK_HVAC, "major", "raised", 1_000 * i)
        for i in range(3)
    ]
    produce(kafka, topics.alerts, list(alerts))

    # several values per key, through the operators' own commands
    book = load_book(settings)
    for alert in alerts[:2]:
        acknowledge(settings, book, alert.alert_id, "alice", "looking")
        acknowledge(settings, book, alert.alert_id, "bob", "not mine", action=AlertStep.UNACKNOWLEDGED)
        acknowledge(settings, book, alert.alert_id, "carol", "on it")
    silences = [add_silence(settings, Matchers(site=f"home-{i}"), 3600, "alice") for i in range(2)]
    for silence in silences:
        book.apply_silence(silence)
        revoke_silence(settings, book, silence.silence_id, "bob")
    devices = [f"thermo-{unique}-{i}" for i in range(2)]
    for device in devices:
        for setpoint in ("19.0", "20.5", "21.5"):
            set_desired(
                settings, device, parse_assignments((f"setpoint_c={setpoint}",)), "alice", 60, "home-1", "thermostat"
            )

    # one more record per topic after segment.ms rolls the segment holding all of the above
    time.sleep(SEGMENT_MS * 2 / 1000)
    acknowledge(settings, book, alerts[2].alert_id, "dave")
    extra_silence = add_silence(settings, Matchers(site="home-9"), 3600, "alice")
    set_desired(settings, f"thermo-{unique}-x", TwinProperties(setpoint_c=18.0), "alice", 60, "home-1", "thermostat")

    acks = {m.key().decode(): decode_record(m.value(), AlertState) for m in wait_compacted(kafka, topics.alert_state)}
    assert {k: (a.by, a.action) for k, a in acks.items()} == {
        alerts[0].alert_id: ("carol", AlertStep.ACKNOWLEDGED),
        alerts[1].alert_id: ("carol", AlertStep.ACKNOWLEDGED),
        alerts[2].alert_id: ("dave", AlertStep.ACKNOWLEDGED),
    }
    kept = {m.key().decode(): decode_record(m.value(), Silence) for m in wait_compacted(kafka, topics.silences)}
    assert set(kept) == {s.silence_id for s in silences} | {extra_silence.silence_id}
    assert all(kept[s.silence_id].revoked_by == "bob" for s in silences)
    twins = [decode_record(m.value(), TwinRecord) for m in wait_compacted(kafka, topics.device_twin)]
    assert sorted((t.device_id, t.version, t.properties.setpoint_c) for t in twins) == sorted(
        [(device, 3, 21.5) for device in devices] + [(f"thermo-{unique}-x", 1, 18.0)]
    )

    # a forwarder started now rebuilds the acknowledgements and silences from the compacted topics
    tree = parse_routing(
        {
            "receivers": {"pager": {"url": "http://127.0.0.1:9/never"}},
            "route": {"receiver": "pager", "group_wait": "1h"},
        }
    )
    forwarder = Dispatcher(settings, AlertsSettings(state_dir=tmp_path), tree, threading.Event())
    forwarder.run(timeout_s=0.5)
    assert {a.alert_id: forwarder.book.alerts[a.alert_id].status for a in alerts} == {
        a.alert_id: "acknowledged" for a in alerts
    }
    assert forwarder.book.alerts[alerts[0].alert_id].ack.by == "carol"  # type: ignore[union-attr]
    now_ms = int(time.time() * 1000)
    assert [s.silence_id for s in forwarder.book.silences.values() if s.ends_at_ms > now_ms] == [
        extra_silence.silence_id
    ]
    # ... and the operators' twin reader has each device's newest desired properties
    for device in devices:
        desired = read_twin(settings, device).desired
        assert desired is not None and (desired.version, desired.properties.setpoint_c) == (3, 21.5)
