"""The scale path: the same job under spark-submit on a Spark standalone cluster.

A real master and worker (two JVMs) run on this machine; ``spark-submit --master
spark://…  streaming/job.py --available-now`` runs the job with its executors in the
worker, against the real Apache Kafka broker, and every record is accounted for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import iotwatch.streaming.job
from iotwatch.clients.kafka import ensure_topics
from iotwatch.settings import Settings
from tests.helpers import read_topic, user_env
from tests.support.scenario import write_scenario
from tests.support.standalone import standalone_cluster

pytestmark = pytest.mark.slow


def test_spark_submit_on_a_standalone_cluster(test_settings: Settings, unique: str, tmp_path: Path) -> None:
    settings = test_settings
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    scenario = write_scenario(settings, unique)
    env = user_env()
    env.update(
        IOTWATCH_KAFKA_BOOTSTRAP_SERVERS=settings.kafka.bootstrap_servers,
        IOTWATCH_INFLUX_URL="",
        IOTWATCH_TOPIC_RAW=settings.topics.raw,
        IOTWATCH_TOPIC_DLQ=settings.topics.dlq,
        IOTWATCH_TOPIC_ALERTS=settings.topics.alerts,
        IOTWATCH_TOPIC_MODEL_UPDATES=settings.topics.model_updates,
        IOTWATCH_STREAM_SILENCE_TIMEOUT_S="3600",
        IOTWATCH_STREAM_MAX_OFFSETS_PER_TRIGGER="400",
        IOTWATCH_STREAM_CHECKPOINT_DIR=str(tmp_path / "checkpoint"),
        IOTWATCH_STREAM_ARCHIVE_DIR=str(tmp_path / "archive"),
        IOTWATCH_REGISTRY_PATH=str(tmp_path / "registry"),
    )
    with standalone_cluster(tmp_path / "cluster") as cluster:
        command = cluster.submit_command(
            Path(iotwatch.streaming.job.__file__), "--available-now", python=sys.executable
        )
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-4000:]
        applications = list(cluster.worker_dir.glob("app-*"))
    assert applications, "no executor ran on the worker"
    summary = next(line for line in reversed(result.stdout.splitlines()) if line.startswith("{"))
    totals = json.loads(summary)["totals"]
    assert totals["reading_records"] == sum(len(seqs) for seqs in scenario.readings.values())
    assert (totals["duplicate"], totals["late"], totals["dlq"]) == (
        scenario.duplicates,
        len(scenario.late),
        scenario.malformed,
    )

    alerts = [json.loads(m.value()) for m in read_topic(settings.kafka, settings.topics.alerts, timeout_s=30, idle_s=3)]
    raised = {(a["device_id"], a["rule"]) for a in alerts if a["state"] == "raised"}
    assert set(scenario.expected_alerts.items()) <= raised, sorted(raised)
    archive = pd.read_parquet(tmp_path / "archive" / "readings").drop_duplicates(["device_id", "seq"])
    assert archive.groupby("device_id")["seq"].apply(sorted).to_dict() == scenario.readings
