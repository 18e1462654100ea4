"""Alert storm control: 10,000 new devices heard once and then silent while other devices
keep reporting -- each silent device's ``device_silent`` alert is kept on the alert topic
(the log of what happened), and the forwarder's default grouping (site and rule) turns them
into one notification per site. (Had every device stopped at once, with nothing else
arriving, that would be one ``ingestion_gap``: tests/e2e/test_outage.py.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from iotwatch.alerts.dispatch import Dispatcher
from iotwatch.alerts.routing import parse_routing
from iotwatch.clients.kafka import ensure_topics, list_topics
from iotwatch.contract.telemetry import Telemetry
from iotwatch.settings import AlertsSettings, Settings
from iotwatch.streaming.job import start
from tests.helpers import InThread, wait_for

pytestmark = pytest.mark.slow

DEVICES, SITES = 10_000, 5


class Keepers:
    """A device in each partition of the raw topic reporting every 0.3 s (their peers' records
    are what tells a silent device from a gap of the whole input)."""

    def __init__(self, settings: Settings, unique: str) -> None:
        self.settings, self.unique = settings, unique
        self.producer = Producer(settings.kafka.client_config())
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        partitions = list_topics(self.settings.kafka)[self.settings.topics.raw]
        seq = 0
        while not self.stop.wait(0.3):
            for p in range(partitions):
                reading = Telemetry(
                    v=1,
                    device_id=f"keeper-{self.unique}-{p}",
                    device_type="door_sensor",
                    site=f"keepers-{self.unique}",
                    seq=seq,
                    ts=int(time.time() * 1000),
                    metrics={"open": 0.0, "battery_pct": 90.0},
                )
                self.producer.produce(
                    self.settings.topics.raw, key=reading.device_id.encode(), value=reading.to_json(), partition=p
                )
            self.producer.poll(0)
            seq += 1
        self.producer.flush(10)


def test_ten_thousand_silent_devices_become_one_notification_per_site(
    spark: Any, test_settings: Settings, unique: str, tmp_path: Path, webhook: Any
) -> None:
    stream = test_settings.stream.model_copy(update={"silence_timeout_s": 3.0, "trigger_interval_s": 0.5})
    settings = test_settings.model_copy(update={"stream": stream})
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    producer = Producer({**settings.kafka.client_config(), "linger.ms": 20})
    now = int(time.time() * 1000)
    sites = [f"storm-{unique}-{s}" for s in range(SITES)]
    for d in range(DEVICES):
        reading = Telemetry(
            v=1,
            device_id=f"storm-{unique}-{d}",
            device_type="door_sensor",
            site=sites[d % SITES],
            seq=0,
            ts=now,
            metrics={"open": 0.0, "battery_pct": 90.0},
        )
        producer.produce(settings.topics.raw, key=reading.device_id.encode(), value=reading.to_json())
        producer.poll(0)
    assert producer.flush(60) == 0

    keepers = Keepers(settings, unique)  # one device per partition that goes on reporting
    job = start(
        spark, settings, checkpoint_dir=tmp_path / "ck", archive_dir=tmp_path / "archive", query_name=f"storm_{unique}"
    )
    try:
        wait_for(lambda: job.totals.get("alerts_raised", 0) >= DEVICES, 300, "every device reported silent")
        assert job.totals["alerts_raised"] == DEVICES
    finally:
        keepers.stop.set()
        keepers.thread.join(10)
        job.stop()

    hook, url = webhook(fail_every=0, retry_after_at=None, stall_at=None)
    tree = parse_routing(
        {
            "receivers": {"oncall": {"url": url}},
            "route": {"receiver": "oncall", "group_wait": "2s", "group_interval": "5m"},
        }
    )
    running = InThread(lambda stop: Dispatcher(settings, AlertsSettings(state_dir=tmp_path / "fwd"), tree, stop))
    try:
        notified = lambda: [body for _, status, body in hook.requests if status == 200]  # noqa: E731
        wait_for(lambda: sum(len(body["alerts"]) for body in notified()) >= DEVICES, 300, "every alert notified")
        # (a group sends again only after its group_interval: tests/unit/alerts/test_notify_policy.py)
        bodies = notified()
        assert len(bodies) == SITES
        assert sorted(body["group_labels"]["site"] for body in bodies) == sorted(sites)
        assert all(
            body["group_labels"]["rule"] == "device_silent" and len(body["alerts"]) == DEVICES // SITES
            for body in bodies
        )
    finally:
        running.close()
