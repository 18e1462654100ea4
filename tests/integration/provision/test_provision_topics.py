"""``iotwatch provision topics``, the compose init step for brokers with auto-creation off,
against the session's real Apache Kafka broker: it creates the pipeline's topics from the
settings, and running it again creates nothing."""

from __future__ import annotations

import json
import subprocess
import sys

from iotwatch.clients.kafka import list_topics
from iotwatch.settings import Settings
from tests.helpers import user_env


def test_provision_topics_creates_the_pipelines_topics_once(test_settings: Settings) -> None:
    topics = test_settings.topics
    env = user_env()
    env.update(
        IOTWATCH_TOPIC_RAW=topics.raw,
        IOTWATCH_TOPIC_DLQ=topics.dlq,
        IOTWATCH_TOPIC_ALERTS=topics.alerts,
        IOTWATCH_TOPIC_MODEL_UPDATES=topics.model_updates,
        IOTWATCH_TOPIC_ALERT_STATE=topics.alert_state,
        IOTWATCH_TOPIC_SILENCES=topics.silences,
        IOTWATCH_TOPIC_NOTIFICATIONS=topics.notifications,
        IOTWATCH_TOPIC_COMMANDS=topics.commands,
        IOTWATCH_TOPIC_DEVICE_TWIN=topics.device_twin,
        IOTWATCH_TOPIC_EMERGENCIES=topics.emergencies,
        IOTWATCH_KAFKA_PARTITIONS="3",
    )
    command = [
        sys.executable,
        "-m",
        "iotwatch.application",
        "provision",
        "topics",
        "--kafka",
        test_settings.kafka.bootstrap_servers,
        "--json",
    ]
    first = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert first.returncode == 0, first.stderr
    every = topics.kafka_topics() + topics.compacted_topics()
    assert sorted(json.loads(first.stdout)["created"]) == sorted(every)
    existing = list_topics(test_settings.kafka)
    assert {name: existing[name] for name in every} == {name: 3 for name in every}
    again = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["created"] == []
