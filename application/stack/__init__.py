"""The embedded single-machine stack: real MQTT, Apache Kafka and InfluxDB servers."""

from iotwatch.application.stack.embedded import EmbeddedStack, StackState

__all__ = ["EmbeddedStack", "StackState"]
