"""The warm-up micro-batch: the job's operator on one synthetic reading, leaving no trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from iotwatch.clients.influx import InfluxV1Client
from iotwatch.clients.kafka import ensure_topics
from iotwatch.settings import Settings
from iotwatch.streaming.warm_up import DEVICE, run_warm_up
from tests.helpers import read_topic

pytestmark = pytest.mark.slow


def test_the_warm_up_runs_one_reading_through_the_operator_and_leaves_no_trace(
    spark, test_settings: Settings, tmp_path: Path
) -> None:
    archive = tmp_path / "archive"
    settings = test_settings.model_copy(
        update={"stream": test_settings.stream.model_copy(update={"archive_dir": archive})}
    )
    ensure_topics(settings.kafka, settings.topics.kafka_topics())

    counts = run_warm_up(spark, settings, int(spark.conf.get("spark.sql.shuffle.partitions")))

    # the reading went through unpacking, the engine and the archive writer
    assert counts["reading"] == 1 and counts["archive_files"] == 1, counts
    assert counts["alerts_raised"] == 0 and counts["dlq"] == 0, counts
    # and nothing of it reached the job's topics, archive or metrics
    for topic in (settings.topics.raw, settings.topics.alerts, settings.topics.dlq):
        assert read_topic(settings.kafka, topic, timeout_s=5, idle_s=2) == [], topic
    assert not archive.exists()
    client = InfluxV1Client(settings.influx)
    try:
        assert client.query(f"SELECT count(*) FROM /.*/ WHERE device_id = '{DEVICE}'") == []
    finally:
        client.close()
