"""A three-broker Apache Kafka cluster losing a broker mid-run: the gateway and the streaming
job carry on and nothing is lost by seq.

Topics have three replicas and ``min.insync.replicas=2``; the gateway's producer writes with
``acks=all`` (idempotent), so a record the gateway acknowledged to MQTT is on two brokers at
least, and killing one (SIGKILL: no clean shutdown, no leader hand-over) loses none of them.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from iotwatch.application.stack.kafka_broker import start_kafka_cluster
from iotwatch.application.stack.process import stop_process
from iotwatch.clients.kafka import ensure_topics
from iotwatch.gateway.bridge import Gateway
from iotwatch.settings import Settings
from iotwatch.streaming.job import root_cause, start
from tests.helpers import Publisher, wait_for
from tests.support.gateway import gateway_settings

pytestmark = pytest.mark.slow

DEVICES = 4
READINGS = 600  # per device, at 100 readings/s in all: the broker dies about a third of the way


def _archived_seqs(archive: Path) -> dict[str, list[int]]:
    try:
        frame = pd.read_parquet(archive / "readings", columns=["device_id", "seq"])
    except (FileNotFoundError, OSError, ValueError):  # nothing written yet
        return {}
    return {device: sorted(set(group)) for device, group in frame.groupby("device_id")["seq"]}


def _leaders(admin: AdminClient, topic: str) -> dict[int, int]:
    return {p.id: p.leader for p in admin.list_topics(topic, timeout=10).topics[topic].partitions.values()}


def _led_without(admin: AdminClient, topic: str, broker: int) -> bool:
    """Every partition of ``topic`` has a leader other than ``broker`` (False while the
    metadata request itself times out: it may have gone to the broker just killed)."""
    try:
        leaders = _leaders(admin, topic)
    except KafkaException:
        return False
    return bool(leaders) and broker not in leaders.values()


def _await(job: Any, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """``wait_for`` that fails at once, with the query's root cause, if the job stops meanwhile."""

    def check() -> bool:
        if not job.query.isActive:
            cause = job.query.exception()
            raise AssertionError(f"the streaming job stopped waiting for {what}: {root_cause(str(cause))}")
        return condition()

    wait_for(check, timeout_s, what)


def test_kill_9_of_one_of_three_brokers_loses_nothing_and_the_pipeline_carries_on(
    spark: Any, stack_settings: Settings, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    brokers = start_kafka_cluster(tmp_path / "cluster", timeout_s=90, nodes=3)  # 3 replicas, min.insync 2
    try:
        kafka = stack_settings.kafka.model_copy(
            update={"bootstrap_servers": ",".join(b.endpoint for b in brokers), "replication_factor": 3}
        )
        topics = stack_settings.topics.model_copy(
            update={"raw": f"c.{run}.raw", "dlq": f"c.{run}.dlq", "alerts": f"c.{run}.alerts"}
        )
        stream = stack_settings.stream.model_copy(update={"trigger_interval_s": 0.5, "silence_timeout_s": 3600.0})
        settings = gateway_settings(
            stack_settings.model_copy(update={"kafka": kafka, "topics": topics, "stream": stream}), run
        )
        ensure_topics(kafka, topics.kafka_topics())
        admin = AdminClient(kafka.client_config())
        assert all(
            len(p.replicas) == 3
            for p in admin.list_topics(topics.raw, timeout=10).topics[topics.raw].partitions.values()
        )
        gateway = Gateway(settings)
        gateway.start()
        job = start(spark, settings, checkpoint_dir=tmp_path / "ck", archive_dir=tmp_path / "archive", query_name=run)
        devices = [f"cl-{run}-{i}" for i in range(DEVICES)]
        try:
            publisher = Publisher(settings.mqtt, devices, count=READINGS, rate_per_s=100).start()
            archived = lambda: sum(map(len, _archived_seqs(tmp_path / "archive").values()))  # noqa: E731
            _await(job, lambda: archived() >= 300, 180, "300 archived")
            # The broker leading partition 0 of the raw topic: the gateway and the job both lose a leader.
            victim_id = _leaders(admin, topics.raw)[0]
            victim = brokers[victim_id - 1]
            os.kill(victim.process.pid, signal.SIGKILL)  # no controlled shutdown, no leader hand-over
            killed_at = time.monotonic()
            wait_for(lambda: _led_without(admin, topics.raw, victim_id), 60, "new partition leaders")
            failover_s = time.monotonic() - killed_at
            publisher.join(timeout=120)
            _await(
                job,
                lambda: _archived_seqs(tmp_path / "archive") == {d: list(range(READINGS)) for d in devices},
                180,
                "every reading of every device archived after the broker's death",
            )
            assert job.query.isActive, "the streaming job stopped when a broker died"
            assert gateway.health()[0], "the gateway reports itself unhealthy with two brokers of three up"
            report = gateway.report()
            assert report["forwarded"] >= DEVICES * READINGS and report["inflight"] == 0, report
            # the totals count a batch once its progress is reported, just after its archive files
            wait_for(lambda: job.totals.get("reading_records", 0) >= DEVICES * READINGS, 30, "the job's totals")
            print(f"broker {victim_id} killed; partitions led elsewhere after {failover_s:.1f} s; gateway {report}")
        finally:
            job.stop()
            gateway.stop()
    finally:
        for broker in brokers:
            stop_process(broker.process, timeout_s=5)
