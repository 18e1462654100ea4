"""Spark's own Kafka connector reading the real broker: the columns the job relies on, offsets
given as JSON, and the packed, decoded chunks the stateful operator receives."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from confluent_kafka import Producer

from iotwatch.clients.kafka import ensure_topics
from iotwatch.settings import Settings
from iotwatch.streaming.kafka_source import read_kafka_batch, read_kafka_stream
from iotwatch.streaming.operator_key import operator_key
from iotwatch.streaming.packing import dictionary_decode, packed_column
from tests.helpers import reading

pytestmark = pytest.mark.slow


def _produce(settings: Settings, topic: str, devices: list[str], count: int) -> None:
    producer = Producer(settings.kafka.client_config())
    for seq in range(count):
        for device in devices:
            producer.produce(
                topic, key=device.encode(), value=reading(device, seq).to_json(), headers=[("h", device.encode())]
            )
    assert producer.flush(30) == 0


def _device_ids(chunk: Any) -> list[str]:
    return dictionary_decode(packed_column(chunk, "device_id"), chunk.device_id_dictionary).tolist()


def test_batch_read_has_keys_values_headers_and_offsets(spark: Any, test_settings: Settings, unique: str) -> None:
    topic = test_settings.topics.raw
    ensure_topics(test_settings.kafka, [topic])
    devices = [f"ks-{unique}-{i}" for i in range(6)]
    _produce(test_settings, topic, devices, 50)
    rows = read_kafka_batch(spark, test_settings.kafka, [topic]).collect()
    assert len(rows) == 300
    assert {row.key.decode() for row in rows} == set(devices)
    assert all(row.headers[0].key == "h" and row.headers[0].value == row.key for row in rows)
    by_partition: dict[int, list[int]] = {}
    for row in rows:
        by_partition.setdefault(row.partition, []).append(row.offset)
    assert all(sorted(offsets) == list(range(len(offsets))) for offsets in by_partition.values())
    # From offset 10 of every partition, as JSON: ten records fewer per partition.
    start = json.dumps({topic: {str(p): 10 for p in by_partition}})
    later = read_kafka_batch(spark, test_settings.kafka, [topic], starting_offsets=start).count()
    assert later == 300 - 10 * len(by_partition)


def test_stream_read_packs_decoded_readings_per_partition(spark: Any, test_settings: Settings, unique: str) -> None:
    topic = test_settings.topics.raw
    ensure_topics(test_settings.kafka, [topic])
    devices = [f"kp-{unique}-{i}" for i in range(4)]
    _produce(test_settings, topic, devices, 25)
    frame = read_kafka_stream(spark, test_settings.kafka, [topic], packed=True, operator_tasks=2)
    query = frame.writeStream.format("memory").queryName(f"packed_{unique}").trigger(availableNow=True).start()
    query.awaitTermination(120)
    chunks = spark.sql(f"SELECT * FROM packed_{unique}").collect()
    seqs: dict[str, list[int]] = {}
    for chunk in chunks:
        assert chunk.operator_key == operator_key(chunk.partition, 2)
        offsets = packed_column(chunk, "offset").tolist()
        assert offsets == sorted(offsets), "a chunk holds one partition's records in offset order"
        assert chunk.topic == topic
        rejected = packed_column(chunk, "rejected").tolist()
        assert rejected == list(chunk.raw) == [], "a valid record's bytes stay in the log"
        for device, seq in zip(_device_ids(chunk), packed_column(chunk, "seq").tolist(), strict=True):
            seqs.setdefault(device, []).append(seq)
    assert {device: sorted(s) for device, s in seqs.items()} == {device: list(range(25)) for device in devices}


def test_stream_read_by_pattern_keeps_each_topics_partitions_apart(
    spark: Any, test_settings: Settings, unique: str
) -> None:
    """Sites: the job reads every site's replica by pattern; partition 0 of two sites' topics
    are two partitions to it (their own state, their own archive files)."""
    topics = {site: f"{site}{unique}.{test_settings.topics.raw}" for site in ("sa", "sb")}
    ensure_topics(test_settings.kafka, list(topics.values()))
    devices = {site: [f"kp-{site}-{unique}-{i}" for i in range(6)] for site in topics}
    for site, topic in topics.items():
        _produce(test_settings, topic, devices[site], 10)
    pattern = rf"s[ab]{unique}\.{re.escape(test_settings.topics.raw)}"
    frame = read_kafka_stream(
        spark, test_settings.kafka, [test_settings.topics.raw], packed=True, operator_tasks=2, pattern=pattern
    )
    query = frame.writeStream.format("memory").queryName(f"pattern_{unique}").trigger(availableNow=True).start()
    query.awaitTermination(120)
    site_of = {device: site for site, names in devices.items() for device in names}
    partitions: dict[str, set[int]] = {site: set() for site in topics}
    seqs: dict[str, list[int]] = {}
    for chunk in spark.sql(f"SELECT * FROM pattern_{unique}").collect():
        assert chunk.operator_key == operator_key(chunk.partition, 2)
        device_ids = _device_ids(chunk)
        assert len({site_of[device] for device in device_ids}) == 1, "a chunk mixes two sites' records"
        partitions[site_of[device_ids[0]]].add(chunk.partition)
        for device, seq in zip(device_ids, packed_column(chunk, "seq").tolist(), strict=True):
            seqs.setdefault(device, []).append(seq)
    assert not partitions["sa"] & partitions["sb"]
    assert {device: sorted(s) for device, s in seqs.items()} == {device: list(range(10)) for device in site_of}
