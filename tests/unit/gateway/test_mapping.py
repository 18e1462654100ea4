"""Routing rules compiled once: the same matches as MQTT (paho's matcher) and the same keys."""

from __future__ import annotations

import pytest
from paho.mqtt.client import topic_matches_sub

from iotwatch.contract.telemetry import Telemetry
from iotwatch.gateway.mapping import Router, RoutingError, filter_regex
from iotwatch.settings import MappingRule, TopicSettings

FILTERS = ["iot/+/+/+/telemetry", "a/#", "#", "+/b", "a/+", "+", "a/b/c", "a/+/#", "$SYS/#", "+/+", "a.b/+"]
TOPICS = [
    "iot/h/t/d/telemetry",
    "iot/h/t/d/status",
    "a",
    "a/b",
    "a/b/c",
    "a//c",
    "/b",
    "$SYS/x",
    "$x/b",
    "",
    "a/",
    "iot//t/d/telemetry",
    "iot/h/t/d/telemetry/x",
    "b",
    "axb/c",
    "a.b/c",
    "a/b\n",
]


@pytest.mark.parametrize("mqtt_filter", FILTERS)
def test_filter_regex_matches_like_paho(mqtt_filter: str) -> None:
    for topic in TOPICS:
        assert bool(filter_regex(mqtt_filter).match(topic)) == topic_matches_sub(mqtt_filter, topic), topic


def test_templates_route_by_constant_field_level_and_format() -> None:
    topics = TopicSettings()
    router = Router(
        [
            MappingRule(),
            MappingRule(mqtt_filter="fleet/+/gps", kafka_topic="gps.{1}", key="{1}", validate_contract=False),
            MappingRule(mqtt_filter="x/#", kafka_topic="{topics.dlq}", key="{0}-{payload.id}", validate_contract=False),
        ],
        topics,
    )
    reading = Telemetry(v=1, device_id="d1", device_type="thermostat", site="s", seq=0, ts=0, metrics={})
    assert router.match("iot/s/thermostat/d1/telemetry").route("iot/s/thermostat/d1/telemetry", reading) == (
        topics.raw,
        b"d1",
    )
    assert router.match("fleet/v7/gps").route("fleet/v7/gps", {}) == ("gps.v7", b"v7")
    assert router.match("x/y").route("x/y", {"id": 3}) == (topics.dlq, b"x-3")
    assert router.static_topics() == [topics.raw, topics.dlq]
    with pytest.raises(RoutingError):
        router.match("x/y").route("x/y", {})
    with pytest.raises(RoutingError):
        router.match("nothing/here")


def test_the_default_rule_subscribes_to_the_telemetry_filter_setting() -> None:
    """``[topics] mqtt_telemetry_filter`` narrows what the gateway takes (the benchmark's
    gateways took every site's telemetry, queued in their sessions after they stopped)."""
    topics = TopicSettings(mqtt_telemetry_filter="iot/site-7/+/+/telemetry")
    router = Router([MappingRule()], topics)
    assert router.subscriptions() == ["iot/site-7/+/+/telemetry"]
    assert router.match("iot/site-7/thermostat/d1/telemetry")
    with pytest.raises(RoutingError):
        router.match("iot/site-8/thermostat/d1/telemetry")
    assert Router([MappingRule()], TopicSettings()).subscriptions() == ["iot/+/+/+/telemetry"]
