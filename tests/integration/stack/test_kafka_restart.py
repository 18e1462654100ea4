"""A Kafka node killed -9 and started again on its own log: serving again without waiting out
its old registration, with every acknowledged record."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import psutil
from confluent_kafka import Producer

from iotwatch.application.stack.kafka_broker import restart_kafka_node, start_kafka_broker
from iotwatch.application.stack.process import stop_process
from iotwatch.clients.kafka import ensure_topics
from iotwatch.settings import KafkaSettings
from tests.helpers import read_topic

_STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] "


def _last(log: str, text: str) -> datetime:
    """The time of the log's last line containing ``text``."""
    stamps = re.findall(_STAMP + r".*" + re.escape(text), log, flags=re.MULTILINE)
    assert stamps, f"no line with {text!r} in the broker's log"
    return datetime.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S,%f")


def test_a_node_killed_and_started_again_registers_without_waiting_out_its_old_session(tmp_path: Path) -> None:
    """After kill -9 the restarted node's controller holds the old registration until its
    session expires (Kafka's default 9 s); the stack's broker keeps that session at 1.5 s, so
    the new registration is taken within a few seconds, and the records acknowledged by all
    in-sync replicas before the kill are all there."""
    service = start_kafka_broker(tmp_path, timeout_s=120)
    settings = KafkaSettings(bootstrap_servers=service.endpoint)
    try:
        ensure_topics(settings, ["restart-check"])
        producer = Producer({**settings.client_config(), "enable.idempotence": True, "acks": "all"})
        for i in range(100):
            producer.produce("restart-check", value=str(i).encode())
        assert producer.flush(30) == 0
        killed = psutil.Process(service.process.pid)
        killed.kill()
        killed.wait(30)
        service = restart_kafka_node(service, timeout_s=120)
        log = Path(service.process.log_file).read_text()
        loaded = _last(log, "Replayed initial RegisterBrokerRecord")  # the old registration, read back
        registered = _last(log, "Successfully registered broker")
        assert 0 < (registered - loaded).total_seconds() < 7.0
        values = sorted(int(m.value()) for m in read_topic(settings, "restart-check", expected=100, timeout_s=60))
        assert values == list(range(100))
    finally:
        stop_process(service.process)
