"""The warm-up micro-batch: the job's operator on one synthetic reading, leaving no trace."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from confluent_kafka import Producer

from iotwatch.clients.influx import InfluxV1Client
from iotwatch.clients.kafka import ensure_topics, topic_partitions
from iotwatch.contract.telemetry import DeviceType
from iotwatch.settings import Settings
from iotwatch.streaming.job import start
from iotwatch.streaming.warm_up import DEVICE, records_waiting, run_warm_up
from tests.helpers import read_topic, reading

pytestmark = pytest.mark.slow


def test_the_warm_up_runs_a_reading_of_each_device_type_through_the_operator_and_leaves_no_trace(
    spark, test_settings: Settings, tmp_path: Path
) -> None:
    archive = tmp_path / "archive"
    settings = test_settings.model_copy(
        update={"stream": test_settings.stream.model_copy(update={"archive_dir": archive})}
    )
    ensure_topics(settings.kafka, settings.topics.kafka_topics())

    counts = run_warm_up(spark, settings, int(spark.conf.get("spark.sql.shuffle.partitions")))

    # the connector read the raw topic's offsets; the readings went through unpacking, the
    # engine and the archive writer (one file per device type)
    raw_partitions = topic_partitions(settings.kafka, [settings.topics.raw], "READ")[settings.topics.raw]
    assert counts["kafka_partitions"] == raw_partitions, counts
    assert counts["reading"] == len(DeviceType) and counts["archive_files"] == len(DeviceType), counts
    assert counts["alerts_raised"] == 0 and counts["dlq"] == 0, counts
    # and nothing of it reached the job's topics, archive or metrics
    for topic in (settings.topics.raw, settings.topics.alerts, settings.topics.dlq):
        assert read_topic(settings.kafka, topic, timeout_s=5, idle_s=2) == [], topic
    assert not archive.exists()
    client = InfluxV1Client(settings.influx)
    try:
        assert client.query(f"SELECT count(*) FROM /.*/ WHERE device_id =~ /^{DEVICE}-/") == []
    finally:
        client.close()


def _produce_readings(settings: Settings, device: str, seqs: range) -> None:
    producer = Producer(settings.kafka.client_config())
    for seq in seqs:
        producer.produce(settings.topics.raw, msgspec.json.encode(reading(device, seq)), key=device.encode())
    assert producer.flush(30) == 0


def test_records_waiting_counts_the_raw_topic_past_the_checkpoint(
    spark, test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    """The job warms up only when nothing is waiting for it: a new pipeline, or one that
    has read everything."""
    settings = test_settings
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    checkpoint = tmp_path / "ck"
    assert records_waiting(settings, checkpoint) == 0  # an empty topic, a new checkpoint

    _produce_readings(settings, f"th-{unique}", range(5))
    assert records_waiting(settings, checkpoint) == 5  # a new checkpoint starts at the earliest
    from_latest = settings.model_copy(
        update={"stream": settings.stream.model_copy(update={"starting_offsets": "latest"})}
    )
    assert records_waiting(from_latest, checkpoint) == 0

    job = start(spark, settings, checkpoint_dir=checkpoint, archive_dir=tmp_path / "archive", available_now=True)
    job.await_backlog(300)
    assert job.totals["reading"] == 5
    assert records_waiting(settings, checkpoint) == 0  # the checkpoint has them all

    _produce_readings(settings, f"th-{unique}", range(5, 7))
    assert records_waiting(settings, checkpoint) == 2
    with_pattern = settings.model_copy(
        update={"topics": settings.topics.model_copy(update={"raw_pattern": r"test\..*\.raw"})}
    )
    assert records_waiting(with_pattern, checkpoint) is None  # cannot tell: the job warms up
