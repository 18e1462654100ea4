"""Thin, shared set-up of the real clients (MQTT, Kafka, InfluxDB) from the settings."""
