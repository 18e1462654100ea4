"""Gateway fixtures: settings for one in-process gateway, and a running one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from iotwatch.clients.kafka import ensure_topics
from iotwatch.gateway.bridge import Gateway
from iotwatch.settings import Settings


def gateway_settings(settings: Settings, unique: str, **gateway: object) -> Settings:
    config = settings.gateway.model_copy(
        update={"client_id": f"gw-{unique}", "metrics_port": 0, "status_interval_s": 1.0, **gateway}
    )
    influx = settings.influx
    return settings.model_copy(update={"gateway": config, "influx": influx})


@pytest.fixture
def running_gateway(test_settings: Settings, unique: str) -> Iterator[Gateway]:
    settings = gateway_settings(test_settings, unique)
    ensure_topics(settings.kafka, [settings.topics.raw, settings.topics.dlq])
    bridge = Gateway(settings)
    bridge.start()
    yield bridge
    bridge.stop()
