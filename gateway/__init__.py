"""The MQTT -> Kafka gateway: at-least-once, dead letters for bad input, metrics."""
