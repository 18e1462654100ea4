"""Library output through Python logging: librdkafka's repeated connection failures summarised."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import Producer

from iotwatch.clients.kafka import client_config
from iotwatch.logs import LIBRDKAFKA, configure
from iotwatch.settings import KafkaSettings
from iotwatch.stack.process import free_port


def test_a_producer_that_cannot_connect_logs_one_line_per_broker(caplog: pytest.LogCaptureFixture) -> None:
    """A long-running client (the gateway's producer) against brokers that refuse: librdkafka
    retries many times a second; the log shows one WARNING per broker, the rest at DEBUG."""
    configure("INFO")
    ports = [free_port(), free_port()]
    kafka = KafkaSettings(bootstrap_servers=",".join(f"127.0.0.1:{p}" for p in ports))
    producer = Producer({**client_config(kafka), "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 100})
    producer.produce("t", b"x")
    with caplog.at_level(logging.DEBUG, logger=LIBRDKAFKA):
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            producer.poll(0.2)
    shown = [r for r in caplog.records if r.name == LIBRDKAFKA and r.levelno >= logging.WARNING]
    assert sorted(r.getMessage().split(":")[0] for r in shown) == ["Kafka broker 127.0.0.1"] * len(ports)
    assert all("Connection refused (retrying; repeats are logged at DEBUG)" in r.getMessage() for r in shown)
    assert sum(r.levelno == logging.DEBUG for r in caplog.records if r.name == LIBRDKAFKA) >= 2
    producer.purge()
