"""The gateway's ``/health`` asks the Kafka cluster: healthy while idle with Kafka up, unhealthy
soon after Kafka goes away, whether or not anything is being produced."""

from __future__ import annotations

import time
from pathlib import Path

import requests

from iotwatch.application.stack.kafka_broker import start_kafka_broker
from iotwatch.application.stack.process import stop_process
from iotwatch.clients.kafka import ensure_topics
from iotwatch.gateway.bridge import Gateway
from iotwatch.settings import Settings
from tests.support.gateway import gateway_settings


def _status_within(url: str, status: int, timeout_s: float) -> tuple[float, str]:
    """Seconds until ``url`` answers ``status`` (and its body); AssertionError past ``timeout_s``."""
    started = time.monotonic()
    last = "no answer"
    while time.monotonic() - started < timeout_s:
        try:
            answer = requests.get(url, timeout=1)
            last = f"{answer.status_code} {answer.text.strip()}"
            if answer.status_code == status:
                return time.monotonic() - started, answer.text
        except requests.RequestException as exc:
            last = str(exc)
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer {status} within {timeout_s} s (last: {last})")


def test_health_is_200_idle_with_kafka_up_and_503_soon_after_kafka_goes_down(
    stack_settings: Settings, unique: str, tmp_path: Path
) -> None:
    kafka_service = start_kafka_broker(tmp_path / "kafka-run", timeout_s=30)  # this test's own broker
    try:
        kafka = stack_settings.kafka.model_copy(update={"bootstrap_servers": kafka_service.endpoint})
        settings = gateway_settings(stack_settings.model_copy(update={"kafka": kafka}), unique)
        ensure_topics(kafka, [settings.topics.raw, settings.topics.dlq])
        bridge = Gateway(settings)
        started = time.monotonic()
        bridge.start()
        try:
            url = f"http://127.0.0.1:{bridge.metrics_port}/health"
            _status_within(url, 200, 5.0 - (time.monotonic() - started))
            time.sleep(12)  # idle, nothing published: still healthy
            assert requests.get(url, timeout=2).status_code == 200
            stop_process(kafka_service.process)
            _elapsed, body = _status_within(url, 503, 15.0)
            assert "Kafka" in body
        finally:
            bridge.stop(drain=False)
    finally:
        stop_process(kafka_service.process)
