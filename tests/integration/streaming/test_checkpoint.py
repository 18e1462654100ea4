"""The job's checkpoint belongs to one Kafka cluster: a checkpoint whose offsets Kafka no longer
has is refused in one line before the query starts, and each cluster has a default of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
from confluent_kafka import Producer

from iotwatch.clients.kafka import ensure_topics
from iotwatch.settings import Settings
from iotwatch.streaming.checkpoint import SOURCE_FILE, WAY_OUT, cluster_id, prepare_checkpoint, resolve_checkpoint
from tests.helpers import reading, user_env


def _spark_checkpoint(folder: Path, topic: str, offsets: dict[int, int]) -> Path:
    """A checkpoint as Spark's offset and commit logs lay it out after one micro-batch."""
    (folder / "offsets").mkdir(parents=True)
    (folder / "commits").mkdir()
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}
    sources = {topic: {str(p): o for p, o in offsets.items()}}
    (folder / "offsets" / "0").write_text(f"v1\n{json.dumps(metadata)}\n{json.dumps(sources)}")
    (folder / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    return folder


def _stream(settings: Settings, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = user_env(home)
    env.update(IOTWATCH_TOPIC_RAW=settings.topics.raw, IOTWATCH_TOPIC_DLQ=settings.topics.dlq)
    env.update(IOTWATCH_TOPIC_ALERTS=settings.topics.alerts)
    command = [sys.executable, "-m", "iotwatch.application", "stream", "--kafka", settings.kafka.bootstrap_servers]
    command += ["--influx", settings.influx.url or "", "--available-now", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def _refusal(result: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr without the progress lines a command logs in a pipe (``stream ...``, ``stream: creating topics``):
    on a terminal those are one transient status line, gone when the command ends."""
    return [line for line in result.stderr.strip().splitlines() if " INFO iotwatch: stream" not in line]


def test_a_checkpoint_of_another_stack_is_refused_in_one_line_naming_the_way_out(
    test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    settings = test_settings
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    # another stack's job read 1,200 records of a topic of the same name; this stack's has 3
    producer = Producer(settings.kafka.client_config())
    for seq in range(3):
        producer.produce(settings.topics.raw, msgspec.json.encode(reading(f"th-{unique}", seq)), partition=0)
    assert producer.flush(30) == 0
    checkpoint = _spark_checkpoint(tmp_path / "ck", settings.topics.raw, {0: 1200})

    started = time.monotonic()
    result = _stream(settings, tmp_path, "--checkpoint", str(checkpoint))

    assert result.returncode != 0
    lines = _refusal(result)
    assert len(lines) == 1, result.stderr
    assert "past its end 3" in lines[0] and WAY_OUT in lines[0], lines[0]
    assert lines[0].startswith(f"iotwatch: error: checkpoint {checkpoint} is at offset 1,200 of ")
    assert time.monotonic() - started < 60  # refused before the query starts, not restarted

    # a checkpoint that says it was written for another cluster is refused even where its offsets fit
    other = _spark_checkpoint(tmp_path / "ck-other", settings.topics.raw, {0: 2})
    (other / SOURCE_FILE).write_text(json.dumps({"kafka_cluster_id": "another-cluster"}))
    result = _stream(settings, tmp_path, "--checkpoint", str(other))
    assert result.returncode != 0
    assert _refusal(result) == [
        f"iotwatch: error: checkpoint {other} belongs to Kafka cluster another-cluster, not "
        f"{cluster_id(settings)} at {settings.kafka.bootstrap_servers}: {WAY_OUT}"
    ]


def test_the_default_checkpoint_is_the_clusters_own(test_settings: Settings, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    settings = test_settings.model_copy(
        update={"stream": test_settings.stream.model_copy(update={"checkpoint_dir": None})}
    )
    default = resolve_checkpoint(settings, None)
    assert default == tmp_path / ".iotwatch" / "checkpoints" / cluster_id(settings) / "stream"
    assert not default.exists()  # a new stack starts with a new checkpoint
    assert resolve_checkpoint(settings, tmp_path / "mine") == tmp_path / "mine"


def test_reset_offsets_sets_the_checkpoint_aside_and_records_the_cluster(
    test_settings: Settings, tmp_path: Path
) -> None:
    settings = test_settings
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    checkpoint = _spark_checkpoint(tmp_path / "ck", settings.topics.raw, {0: 1200})
    cluster = cluster_id(settings)

    prepare_checkpoint(settings, checkpoint, cluster, "latest")

    aside = [p for p in tmp_path.iterdir() if p.name.startswith("ck.set-aside-")]
    assert len(aside) == 1 and (aside[0] / "offsets" / "0").exists()  # kept, not deleted
    assert [p.name for p in checkpoint.iterdir()] == [SOURCE_FILE]
    assert json.loads((checkpoint / SOURCE_FILE).read_text())["kafka_cluster_id"] == cluster
    prepare_checkpoint(settings, checkpoint, cluster, None)  # a new checkpoint of this cluster: accepted
