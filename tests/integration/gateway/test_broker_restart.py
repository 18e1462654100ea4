"""The MQTT broker (mosquitto with persistence) restarted under a running gateway and QoS 1
publishers: nothing is lost by seq.

Why this holds, layer by layer:

- The publishers (paho, QoS 1): paho keeps every QoS 1 message not yet acknowledged in the
  Client object and sends it again after reconnecting, whatever the clean-session flag.
- The broker: mosquitto acknowledges a message once it is queued in the gateway's
  persistent session and writes the database on SIGTERM, so the restarted broker still
  holds it. Started as root, mosquitto would drop to user ``mosquitto``, could not write
  its database in the 0700 run folder, and would come back with no session; the embedded
  stack keeps the starting user, and the test checks the database was written and the
  session resumed.
- The gateway: a persistent session (MQTT 5, clean_start off, session expiry) and a
  PUBACK only after Kafka confirmed the record, so the broker redelivers anything not
  yet in Kafka (duplicates, never gaps).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iotwatch.application.stack.mqtt_broker import start_mqtt_broker
from iotwatch.application.stack.process import log_tail, stop_process
from iotwatch.clients.kafka import ensure_topics
from iotwatch.gateway.bridge import Gateway
from iotwatch.settings import Settings
from tests.helpers import Publisher, assert_no_loss, read_all_seqs, read_topic, seqs_by_device, user_env
from tests.support.gateway import gateway_settings


class Broker:
    """The test's own mosquitto (the embedded stack's configuration, persistence on), which
    it restarts the way ``docker-compose restart`` does: SIGTERM, then the same port."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.running = start_mqtt_broker(folder, "mosquitto", timeout_s=30)
        self.endpoint = self.running.endpoint

    def restart(self) -> None:
        stop_process(self.running.process)  # SIGTERM: mosquitto writes its database and exits
        assert (self.folder / "mqtt" / "mosquitto.db").exists(), "mosquitto did not save its database on SIGTERM"
        time.sleep(1.0)
        self.running = start_mqtt_broker(
            self.folder, "mosquitto", timeout_s=30, port=int(self.endpoint.rsplit(":", 1)[1])
        )

    def stop(self) -> None:
        stop_process(self.running.process)

    def join(self, publisher: Publisher) -> None:
        """Wait for ``publisher``; if it fails, say whether the restarted broker still runs
        and what it logged last (a broker that died is a different failure from a lost
        acknowledgement)."""
        try:
            publisher.join(timeout=120)
        except AssertionError as exc:
            alive = "running" if self.running.process.is_running() else "NOT running"
            tail = log_tail(self.running.process, 20)
            raise AssertionError(f"{exc}; the restarted broker is {alive}; {tail}") from exc


def _gateway(test_settings: Settings, unique: str, broker: Broker) -> tuple[Settings, Gateway]:
    """A started gateway on ``broker`` and this test's topics."""
    mqtt = test_settings.mqtt.model_copy(update={"url": broker.endpoint})
    settings = gateway_settings(test_settings.model_copy(update={"mqtt": mqtt}), unique)
    ensure_topics(settings.kafka, [settings.topics.raw, settings.topics.dlq])
    bridge = Gateway(settings)
    bridge.start()
    return settings, bridge


def test_mosquitto_restart_with_persistence_loses_nothing(
    test_settings: Settings, unique: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="iotwatch.gateway.bridge")
    broker = Broker(tmp_path)
    try:
        settings, bridge = _gateway(test_settings, unique, broker)
        devices = [f"rs-{unique}-{i}" for i in range(4)]
        publisher = Publisher(settings.mqtt, devices, count=1500, rate_per_s=1000).start()
        time.sleep(2.0)
        broker.restart()
        broker.join(publisher)
        _records, seqs = read_all_seqs(settings.kafka, settings.topics.raw, devices, 1500, timeout_s=30)
        summary = bridge.stop()
    finally:
        broker.stop()
    assert "connected to MQTT (resumed session)" in caplog.text, "the restarted broker lost the gateway's session"
    dead = read_topic(settings.kafka, settings.topics.dlq, timeout_s=5, idle_s=1)
    assert not dead, [(m.headers(), m.value()[:200]) for m in dead]
    assert_no_loss(seqs, devices, 1500)
    # Order is not kept across the reconnect: paho sends what it kept within its in-flight
    # window and queues the rest behind new publishes, so the gateway counts gaps that the
    # kept readings then fill (each counted as a duplicate when it arrives). Every gap filled:
    assert summary["seq_gaps"] <= summary["duplicates"] and summary["inflight"] == 0


def test_mosquitto_restart_under_the_real_simulator_loses_nothing(
    test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    """The same restart under ``iotwatch simulate`` at QoS 1 (its own connections and
    in-flight window, no faults): every reading of every device arrives, and the simulator
    reports no error (a message not acknowledged when the connection drops, or published
    while it is down, is kept by the simulator's client and sent after the reconnect)."""
    broker = Broker(tmp_path)
    simulator: subprocess.Popen[str] | None = None
    try:
        settings, bridge = _gateway(test_settings, unique, broker)
        env = user_env()
        env["IOTWATCH_INFLUX_URL"] = ""
        simulator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "iotwatch.application",
                "--log-level",
                "WARNING",
                "simulate",
                "--mqtt",
                broker.endpoint,
                "--homes",
                "2",
                "--vehicles",
                "0",
                "--mix",
                "thermostat=2",
                "--target-rate",
                "500",
                "--count",
                "3000",
                "--qos",
                "1",
                "--seq-state",
                str(tmp_path / "seq-state.json"),
                "--client-id-prefix",
                f"sim-{unique}",
                "--no-progress",
                "--json",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(3.0)
        assert simulator.poll() is None, simulator.communicate()
        broker.restart()
        stdout, stderr = simulator.communicate(timeout=60)
        assert simulator.returncode == 0, (stdout[-2000:], stderr[-2000:])
        report = json.loads(stdout[stdout.rfind("\n{") + 1 :])
        time.sleep(2.0)
        records = read_topic(settings.kafka, settings.topics.raw, timeout_s=30, idle_s=3)
        summary = bridge.stop()
    finally:
        if simulator is not None and simulator.poll() is None:
            simulator.kill()
        broker.stop()
    assert (report["sent"], report["errors"], report["unacked"]) == (3000, 0, 0), report
    seqs = seqs_by_device(records)
    assert len(seqs) == 4, sorted(seqs)
    assert_no_loss(seqs, list(seqs), 750)  # 3,000 readings of 4 devices, seq 0 to 749 each
    assert summary["seq_gaps"] == 0 and summary["inflight"] == 0
