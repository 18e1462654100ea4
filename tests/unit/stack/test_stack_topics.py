"""The embedded stack follows the topic names it was started with, a ``--config`` file's
``[topics]`` table included, rather than the defaults."""

from __future__ import annotations

from pathlib import Path

from iotwatch.application.stack.embedded import StackState
from iotwatch.application.stack.process import ProcessRecord
from iotwatch.application.stack.service import RunningService
from iotwatch.settings import TopicSettings, load_settings


def _service(role: str, endpoint: str) -> RunningService:
    return RunningService(role, "test", endpoint, ProcessRecord(role, 0, 0.0, [], "/dev/null"))


def test_a_stack_with_sites_points_the_job_at_the_configured_raw_topic(tmp_path: Path) -> None:
    config = tmp_path / "iotwatch.toml"
    config.write_text('[topics]\nraw = "plant.readings"\n')
    topics = load_settings(config).topics
    services = {
        "kafka": _service("kafka", "127.0.0.1:9092"),
        "east-kafka": _service("east-kafka", "127.0.0.1:9093"),
        "east-mqtt": _service("east-mqtt", "mqtt://127.0.0.1:1883"),
    }
    state = StackState(tmp_path, services, topic_settings=topics)
    pattern = state.env()[TopicSettings.env_name("raw_pattern")]
    assert pattern == topics.site_replicas("plant.readings") != TopicSettings().site_replicas(TopicSettings().raw)
    state.save()
    loaded = StackState.load(tmp_path)
    assert loaded is not None and loaded.topic_settings.raw == "plant.readings"
    assert loaded.env()[TopicSettings.env_name("raw_pattern")] == pattern
