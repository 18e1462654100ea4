"""Routing rules: which Kafka topic and key an MQTT message goes to (docs/internals.md, "Routing
rules")."""

from __future__ import annotations

import re
from typing import Any

from iotwatch.errors import UserError
from iotwatch.settings import MappingRule, TopicSettings


class RoutingError(ValueError):
    """The message matches no rule, or a template refers to something the message lacks."""


class _Fields:
    """Attribute access to a payload's top-level fields for format templates."""

    def __init__(self, payload: Any) -> None:
        self._payload = payload

    def __getattr__(self, name: str) -> Any:
        return _field(self._payload, name)


def _field(payload: Any, name: str) -> Any:
    if isinstance(payload, dict):
        if name in payload:
            return payload[name]
    elif hasattr(payload, name):
        return getattr(payload, name)
    raise RoutingError(f"payload has no field {name!r}")


def filter_regex(mqtt_filter: str) -> re.Pattern[str]:
    """The MQTT topic filter as a regular expression with the standard's matching rules:
    ``+`` is one level (possibly empty), a final ``#`` any number of levels including none
    (``a/#`` matches ``a``), and a wildcard first level never matches a ``$`` topic."""
    levels = mqtt_filter.split("/")
    parts: list[str] = []
    for index, level in enumerate(levels):
        if level == "#" and index == len(levels) - 1:
            parts.append("(?:/.*)?" if parts else ".*")
            continue
        if parts:
            parts.append("/")
        parts.append("[^/]*" if level == "+" else re.escape(level))
    guard = r"(?!\$)" if levels[0] in ("+", "#") else ""
    return re.compile(guard + "".join(parts) + r"\Z", re.DOTALL)


_FIELD_TEMPLATE = re.compile(r"\{payload\.([A-Za-z_][A-Za-z0-9_]*)\}")
_LEVEL_TEMPLATE = re.compile(r"\{([0-9]+)\}")


class _Template:
    """A compiled template: a constant, one payload field, one topic level, or a format call."""

    def __init__(self, text: str, topics: TopicSettings) -> None:
        self.text = text
        self.topics = topics
        self.constant: str | None = None
        self.field: str | None = None
        self.level: int | None = None
        try:
            self.constant = text.format(topics=topics)
            return
        except (IndexError, KeyError, AttributeError):
            pass
        if match := _FIELD_TEMPLATE.fullmatch(text):
            self.field = match.group(1)
        elif match := _LEVEL_TEMPLATE.fullmatch(text):
            self.level = int(match.group(1))

    def render(self, mqtt_topic: str, payload: Any) -> str:
        if self.constant is not None:
            return self.constant
        if self.field is not None:
            return str(_field(payload, self.field))
        levels = mqtt_topic.split("/")
        if self.level is not None:
            if self.level >= len(levels):
                raise RoutingError(f"template {self.text!r} cannot be filled for {mqtt_topic!r}: no level {self.level}")
            return levels[self.level]
        try:
            return self.text.format(*levels, payload=_Fields(payload), topics=self.topics)
        except (IndexError, KeyError, AttributeError) as exc:
            raise RoutingError(f"template {self.text!r} cannot be filled for {mqtt_topic!r}: {exc}") from None


class CompiledRule:
    """One rule ready to apply: its filter as a regex match, its templates compiled."""

    def __init__(self, rule: MappingRule, topics: TopicSettings) -> None:
        self.rule = rule
        self.validate_contract = rule.validate_contract
        #: the filter, with ``{topics.*}`` filled (the default rule's is the telemetry filter setting)
        self.mqtt_filter = rule.mqtt_filter.format(topics=topics) if "{" in rule.mqtt_filter else rule.mqtt_filter
        self.matches = filter_regex(self.mqtt_filter).match
        self._topic = _Template(rule.kafka_topic, topics)
        self._key = _Template(rule.key, topics)

    @property
    def static_topic(self) -> str | None:
        return self._topic.constant

    def route(self, mqtt_topic: str, payload: Any) -> tuple[str, bytes]:
        """The Kafka topic and key for this message, or :class:`RoutingError`."""
        topic = self._topic.render(mqtt_topic, payload)
        if not topic:
            raise RoutingError(f"rule for {self.rule.mqtt_filter!r} produced an empty Kafka topic")
        return topic, self._key.render(mqtt_topic, payload).encode()


class Router:
    """Applies the first matching rule (rules are tried in order)."""

    def __init__(self, rules: list[MappingRule], topics: TopicSettings) -> None:
        if not rules:
            raise UserError("the gateway needs at least one mapping rule")
        self.rules = rules
        self.topics = topics
        self.compiled = [CompiledRule(rule, topics) for rule in rules]

    def subscriptions(self) -> list[str]:
        return list(dict.fromkeys(compiled.mqtt_filter for compiled in self.compiled))

    def static_topics(self) -> list[str]:
        """Kafka topics known before any message arrives (templates using only ``{topics.*}``),
        so they can be created up front."""
        return list(dict.fromkeys(c.static_topic for c in self.compiled if c.static_topic is not None))

    def match(self, mqtt_topic: str) -> CompiledRule:
        """The first rule whose filter matches, or :class:`RoutingError`."""
        for compiled in self.compiled:
            if compiled.matches(mqtt_topic) is not None:
                return compiled
        raise RoutingError(f"no mapping rule matches MQTT topic {mqtt_topic!r}")
