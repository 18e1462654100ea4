"""The embedded single-machine stack: real MQTT, Kafka-protocol and InfluxDB servers."""

from iotwatch.stack.embedded import EmbeddedStack, StackState

__all__ = ["EmbeddedStack", "StackState"]
