"""Routing rules: which Kafka topic and key an MQTT message goes to.

Templates use Python's format syntax: ``{1}`` is a level of the MQTT topic (from 0),
``{payload.device_id}`` a top-level payload field, ``{topics.raw}`` a configured topic name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paho.mqtt.client import topic_matches_sub

from iotwatch.settings import MappingRule, TopicSettings


class RoutingError(ValueError):
    """The message matches no rule, or a template refers to something the message lacks."""


class _Fields:
    """Attribute access to a payload's top-level fields for format templates."""

    def __init__(self, payload: Any) -> None:
        self._payload = payload

    def __getattr__(self, name: str) -> Any:
        if isinstance(self._payload, dict):
            if name in self._payload:
                return self._payload[name]
        elif hasattr(self._payload, name):
            return getattr(self._payload, name)
        raise RoutingError(f"payload has no field {name!r}")


@dataclass(frozen=True)
class Route:
    kafka_topic: str
    key: bytes


class Router:
    """Applies the first matching rule (rules are tried in order)."""

    def __init__(self, rules: list[MappingRule], topics: TopicSettings) -> None:
        if not rules:
            raise ValueError("the gateway needs at least one mapping rule")
        self.rules = rules
        self.topics = topics

    def subscriptions(self) -> list[str]:
        return list(dict.fromkeys(rule.mqtt_filter for rule in self.rules))

    def static_topics(self) -> list[str]:
        """Kafka topics known before any message arrives (templates using only ``{topics.*}``),
        so they can be created up front."""
        names = []
        for rule in self.rules:
            try:
                names.append(rule.kafka_topic.format(topics=self.topics))
            except (IndexError, KeyError, AttributeError):
                continue  # depends on the message
        return list(dict.fromkeys(names))

    def rule_for(self, mqtt_topic: str) -> MappingRule:
        for rule in self.rules:
            if topic_matches_sub(rule.mqtt_filter, mqtt_topic):
                return rule
        raise RoutingError(f"no mapping rule matches MQTT topic {mqtt_topic!r}")

    def route(self, rule: MappingRule, mqtt_topic: str, payload: Any) -> Route:
        levels = mqtt_topic.split("/")
        fields = _Fields(payload)
        try:
            topic = rule.kafka_topic.format(*levels, payload=fields, topics=self.topics)
            key = rule.key.format(*levels, payload=fields, topics=self.topics)
        except (IndexError, KeyError, AttributeError) as exc:
            raise RoutingError(f"template cannot be filled for {mqtt_topic!r}: {exc}") from None
        if not topic:
            raise RoutingError(f"rule for {rule.mqtt_filter!r} produced an empty Kafka topic")
        return Route(topic, key.encode())
