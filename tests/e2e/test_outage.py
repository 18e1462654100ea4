"""An outage of Kafka under a running fleet is one ``ingestion_gap``, not a silence per device;
a clean stop is a goodbye, not silence; a device that drops its connection is silent.

A stack of its own (its Kafka is stopped and started), a gateway, the streaming job on the
session's Spark and ``iotwatch simulate`` with 30 devices, on short timeouts: silence 8 s,
gap 4 s, an outage of 20 s (the acceptance run of docs/runbooks.md uses the defaults and
120 s).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from iotwatch.application.stack import EmbeddedStack
from iotwatch.clients.kafka import ensure_topics
from iotwatch.clients.mqtt import make_client
from iotwatch.contract.alerts import decode_alert
from iotwatch.contract.device_topics import DeviceStatus, status_payload, status_topic, telemetry_topic
from iotwatch.gateway.bridge import Gateway
from iotwatch.settings import Settings
from iotwatch.streaming.ingestion_gap import GapAlertWriter, IngestionGaps
from iotwatch.streaming.job import start
from tests.helpers import read_topic, reading, seqs_by_device, user_env, wait_for
from tests.support.gateway import gateway_settings

pytestmark = pytest.mark.slow

OUTAGE_S = 20.0
SILENCE_S = 8.0
#: Long enough that a broker busy loading its coordinators after the restart (a few seconds on a
#: loaded 2-core machine) is not a second gap, well inside the outage.
GAP_S = 10.0


class LostDevice:
    """A device publishing every 0.5 s with a last will, until :meth:`drop` cuts its
    connection without an MQTT DISCONNECT (the will fires; no goodbye is sent)."""

    def __init__(self, settings: Settings, device: str) -> None:
        self.device, self.seq = device, 0
        self.client = make_client(settings.mqtt, f"lost-{device}")
        self.client.will_set(
            status_topic("home-lost", "thermostat", device), status_payload(DeviceStatus.LOST, 0), 1, True
        )
        self.client.connect(settings.mqtt.host, settings.mqtt.port, keepalive=2)
        self.client.loop_start()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        topic = telemetry_topic("home-lost", "thermostat", self.device)
        while not self.stop.wait(0.5):
            message = reading(self.device, self.seq, site="home-lost")
            self.client.publish(topic, message.to_json(), qos=1)
            self.seq += 1

    def drop(self) -> None:
        self.stop.set()
        self.thread.join(5)
        time.sleep(1.0)  # its last readings acknowledged
        self.client.loop_stop()
        sock = self.client.socket()
        if sock is not None:
            sock.close()


def test_a_kafka_outage_is_one_ingestion_gap_and_a_clean_stop_is_no_silence(
    spark: Any, base_settings: Settings, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    base = base_settings.model_copy(update={"stack": base_settings.stack.model_copy(update={"influxdb": "none"})})
    embedded = EmbeddedStack(base, tmp_path / "stack")
    state = embedded.up()
    stream = base.stream.model_copy(
        update={"silence_timeout_s": SILENCE_S, "ingestion_gap_s": GAP_S, "trigger_interval_s": 0.5}
    )
    settings = gateway_settings(state.apply_to(base).model_copy(update={"stream": stream}), run)
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    gateway = Gateway(settings)
    gateway.start()
    writer = GapAlertWriter(settings)
    gaps = IngestionGaps(settings, writer)
    job = start(
        spark,
        settings,
        checkpoint_dir=tmp_path / "ck",
        archive_dir=tmp_path / "archive",
        query_name=f"outage_{run}",
        gaps=gaps,
    )
    env = {**user_env(home=tmp_path / "home"), **state.env()}
    fleet = subprocess.Popen(
        [sys.executable, "-m", "iotwatch.application", "simulate", "--homes", "10", "--vehicles", "0", "--json"]
        + ["--mix", "thermostat=1,smart_meter=1,air_quality=1", "--seed", "5"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lost = LostDevice(settings, f"lost-{run}")
    try:
        wait_for(lambda: job.totals.get("reading_records", 0) >= 300, 180, "the job scoring the fleet")
        assert embedded.stop_service("kafka")
        time.sleep(OUTAGE_S)
        assert gaps.open_gaps() == [settings.topics.raw]  # raised while Kafka is down
        assert embedded.start_service("kafka")
        wait_for(lambda: not gaps.open_gaps(), 120, "the gap cleared by the records after the outage")
        wait_for(lambda: gateway.report()["inflight"] == 0, 300, "the gateway's backlog in Kafka")
        lost.drop()  # while the fleet keeps reporting
        time.sleep(SILENCE_S + 6)
        fleet.send_signal(signal.SIGINT)  # a clean stop: every device says goodbye
        out, err = fleet.communicate(timeout=60)
        assert fleet.returncode == 0, err[-2000:]
        summary = json.loads(out[out.index("{") :])
        wait_for(lambda: gateway.report()["inflight"] == 0, 60, "the goodbyes in Kafka")
        time.sleep(SILENCE_S + 6)  # past the silence timeout of the goodbyes
        assert job.query.isActive and job.query.exception() is None
        alerts = [decode_alert(m.value()) for m in read_topic(settings.kafka, settings.topics.alerts, idle_s=3)]
        raw = read_topic(settings.kafka, settings.topics.raw, idle_s=3)
    finally:
        if fleet.poll() is None:
            fleet.kill()
        lost.stop.set()
        job.stop()
        writer.close()
        gateway.stop()
        embedded.down()
    silent = sorted({a.device_id for a in alerts if a.rule == "device_silent" and a.raised})
    assert silent == [lost.device], silent
    gap = [(a.state, a.alert_id, a.site) for a in alerts if a.rule == "ingestion_gap"]
    assert [g[0] for g in gap] == ["raised", "cleared"] and gap[0][1] == gap[1][1] and gap[0][2] == "cluster", gap
    seqs = seqs_by_device(raw)
    devices = [d for d in seqs if d != lost.device]
    assert len(devices) == 30 and summary["readings"] >= 30 * 30
    for device in devices:  # loss 0 by seq: every seq from 0 to the goodbye
        assert sorted(set(seqs[device])) == list(range(max(seqs[device]) + 1)), device
    assert sum(len(set(seqs[d])) for d in devices) == summary["readings"]
