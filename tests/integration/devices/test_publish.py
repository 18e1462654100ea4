"""The simulator against the session's real broker: what the summary says arrived, arrived."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from iotwatch.contract.telemetry import decode_telemetry
from iotwatch.devices.broker_run import RunOptions, run
from iotwatch.devices.config import SimConfig
from iotwatch.settings import Settings

IOTWATCH = [sys.executable, "-m", "iotwatch.application"]


class Subscriber:
    """A paho subscriber collecting payloads per topic."""

    def __init__(self, settings: Settings, topic: str) -> None:
        mqtt = settings.mqtt
        self.messages: list[tuple[str, bytes, bool]] = []
        self.lock = threading.Lock()
        ready = threading.Event()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"test-sub-{os.getpid()}-{time.time_ns()}")
        self.client.on_subscribe = lambda *_: ready.set()
        self.client.on_message = self._on_message
        self.client.connect(mqtt.host, mqtt.port)
        self.client.loop_start()
        self.client.subscribe(topic, qos=1)
        assert ready.wait(10)

    def _on_message(self, _c: Any, _u: Any, msg: paho.MQTTMessage) -> None:
        with self.lock:
            self.messages.append((msg.topic, msg.payload, bool(msg.retain)))

    def wait_for(self, count: int, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.messages) < count:
            time.sleep(0.05)
        time.sleep(0.3)  # anything beyond the count would show up now

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _telemetry(sub: Subscriber, devices: set[str]) -> dict[str, list[int]]:
    seqs: dict[str, list[int]] = defaultdict(list)
    for _topic, payload, _ in sub.messages:
        message = decode_telemetry(payload)
        if message.device_id in devices:
            seqs[message.device_id].append(message.seq)
    return seqs


def test_subscriber_receives_exactly_what_the_summary_reports(
    stack_settings: Settings, unique: str, tmp_path: Path
) -> None:
    config = SimConfig(seed=21, homes=8, vehicles=2, start_ms=int(time.time() * 1000) - 20_000, duration_s=20)
    sub = Subscriber(stack_settings, "iot/+/+/+/telemetry")
    try:
        options = RunOptions(
            mqtt=stack_settings.mqtt,
            qos=1,
            processes=2,
            connections=2,
            as_fast_as_possible=True,
            client_prefix=f"test-{unique}",
            ground_truth=tmp_path / "gt.jsonl",
        )
        summary = run(config, options)
        sub.wait_for(summary["sent"])
    finally:
        sub.close()
    assert summary["errors"] == 0 and summary["unacked"] == 0
    devices = {f"vehicle-{v:05d}" for v in range(2)} | {json.loads(p)["device_id"] for _, p, _ in sub.messages}
    seqs = _telemetry(sub, devices)
    assert sum(len(s) for s in seqs.values()) == summary["sent"] == summary["readings"]
    assert len(seqs) == summary["device_total"]
    for device_id, received in seqs.items():
        assert received == list(range(len(received))), device_id  # gap-free and in order
    by_type: dict[str, int] = defaultdict(int)
    for _, payload, _ in sub.messages:
        by_type[json.loads(payload)["device_type"]] += 1
    assert dict(by_type) == summary["by_device_type"]
    latency = summary["publish_latency"]
    assert latency and 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    assert latency["samples"] == summary["sent"]
    assert (tmp_path / "gt.jsonl").read_text() == "" and summary["ground_truth"]["records"] == 0


def test_qos0_with_faults_counts_every_copy(stack_settings: Settings, unique: str, tmp_path: Path) -> None:
    config = SimConfig(
        seed=3,
        homes=4,
        vehicles=1,
        start_ms=int(time.time() * 1000) - 600_000,
        duration_s=600,
        fault_rate=20.0,
        fault_kinds=("duplicate", "malformed", "late"),
        tick_ms=1000,
        rate=0.2,
        vehicle_hz=1.0,
    )
    sub = Subscriber(stack_settings, "iot/+/+/+/telemetry")
    try:
        summary = run(
            config,
            RunOptions(mqtt=stack_settings.mqtt, qos=0, as_fast_as_possible=True, ground_truth=tmp_path / "gt.jsonl"),
        )
        sub.wait_for(summary["sent"])
    finally:
        sub.close()
    assert len(sub.messages) == summary["sent"] and summary["errors"] == 0
    records = [json.loads(line) for line in (tmp_path / "gt.jsonl").read_text().splitlines()]
    duplicates = sum(r["params"]["copies"] * r["messages"] for r in records if r["kind"] == "duplicate")
    assert summary["sent"] == summary["readings"] + duplicates
    malformed = sum(r["messages"] for r in records if r["kind"] == "malformed")
    invalid = 0
    for _, payload, _ in sub.messages:
        try:
            decode_telemetry(payload)
        except ValueError:
            invalid += 1
    assert malformed > 0 and invalid == malformed
    assert summary["publish_latency"] is None


def _retained_status(settings: Settings, topic: str, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    sub = Subscriber(settings, topic)
    try:
        sub.wait_for(1, timeout_s)
        return [json.loads(p) for _, p, retained in sub.messages]
    finally:
        sub.close()


def test_status_is_retained_and_the_last_will_marks_a_killed_device_offline(
    stack_settings: Settings, unique: str, tmp_path: Path
) -> None:
    topic = "iot/home-00000/leak_sensor/home-00000-leak_sensor-0/status"
    env = {**os.environ, "IOTWATCH_MQTT_URL": stack_settings.mqtt.url}
    proc = subprocess.Popen(
        [
            *IOTWATCH,
            "simulate",
            "--homes",
            "1",
            "--vehicles",
            "0",
            "--mix",
            "leak_sensor=1",
            "--duration",
            "120",
            "--connection-per-device",
            "--qos",
            "1",
            "--seed",
            "5",
            "--no-progress",
            "--client-id-prefix",
            f"test-{unique}",
            "--seq-state",
            str(tmp_path / "seq.json"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        sub = Subscriber(stack_settings, topic)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(json.loads(p)["state"] == "online" for _, p, _ in sub.messages):
            time.sleep(0.1)
        assert any(json.loads(p)["state"] == "online" for _, p, _ in sub.messages), proc.stderr
        killed_at = len(sub.messages)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(sub.messages) == killed_at:
            time.sleep(0.1)
        sub.close()
        assert [json.loads(p)["state"] for _, p, _ in sub.messages[killed_at:]] == ["lost"]  # the will
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [s["state"] for s in _retained_status(stack_settings, topic)] == ["lost"]


def test_cli_simulate_json_run(stack_settings: Settings, unique: str, tmp_path: Path) -> None:
    gt = tmp_path / "gt.jsonl"
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"anomalies": [{"kind": "spike", "devices": "home-*-smart_meter-0", "at_s": 1}]}))
    sub = Subscriber(stack_settings, "iot/+/+/+/status")
    result = subprocess.run(
        [
            *IOTWATCH,
            "simulate",
            "--mqtt",
            stack_settings.mqtt.url,
            "--homes",
            "3",
            "--vehicles",
            "1",
            "--duration",
            "30",
            "--as-fast-as-possible",
            "--qos",
            "1",
            "--scenario",
            str(scenario),
            "--ground-truth",
            str(gt),
            "--json",
            "--client-id-prefix",
            f"test-{unique}",
            "--seq-state",
            str(tmp_path / "seq.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    sub.wait_for(1, 2)
    sub.close()
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["sent"] == summary["readings"] > 0 and summary["errors"] == 0
    assert summary["device_total"] == sum(summary["devices"].values())
    assert summary["status_messages"] == 2 * summary["device_total"]
    assert summary["anomalies"] == {"spike": 3} and summary["ground_truth"]["records"] == 3
    assert [json.loads(line)["kind"] for line in gt.read_text().splitlines()] == ["spike"] * 3
    states = {(topic, json.loads(p)["state"]) for topic, p, _ in sub.messages if "vehicle-00000" in topic}
    assert ("iot/fleet-000/vehicle_edr/vehicle-00000/status", "offline") in states


def test_cli_errors_are_one_line(stack_settings: Settings) -> None:
    result = subprocess.run(
        [
            *IOTWATCH,
            "simulate",
            "--mqtt",
            stack_settings.mqtt.url,
            "--anomalies",
            "gremlins",
            "--anomaly-rate",
            "1",
            "--duration",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0 and "unknown anomaly kind 'gremlins'" in result.stderr
