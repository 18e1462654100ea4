"""The same ``iotwatch simulate`` twice into one running pipeline: the second run is scored too.

The pipeline drops duplicates by (device_id, seq), so a second run whose devices started
again at seq 0 would be dropped whole and its anomalies never alerted: the simulator carries
each device's seq (and event time) on from its state file.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from iotwatch.application.stack.process import free_port
from iotwatch.clients.kafka import ensure_topics
from iotwatch.settings import Settings
from tests.helpers import read_topic, user_env

pytestmark = pytest.mark.slow

IOTWATCH = [sys.executable, "-m", "iotwatch.application"]


def _env(settings: Settings, home: Path) -> dict[str, str]:
    env = user_env(home)
    env.update(
        IOTWATCH_TOPIC_RAW=settings.topics.raw,
        IOTWATCH_TOPIC_DLQ=settings.topics.dlq,
        IOTWATCH_TOPIC_ALERTS=settings.topics.alerts,
        IOTWATCH_STREAM_SILENCE_TIMEOUT_S="3600",
        IOTWATCH_MQTT_URL=settings.mqtt.url,
        IOTWATCH_KAFKA_BOOTSTRAP_SERVERS=settings.kafka.bootstrap_servers,
        IOTWATCH_INFLUX_URL="",
    )
    return env


def _anomaly_alerts(settings: Settings) -> list[dict[str, Any]]:
    records = read_topic(settings.kafka, settings.topics.alerts, timeout_s=10, idle_s=2)
    return [
        a for a in (json.loads(m.value()) for m in records) if a["state"] == "raised" and a["rule"] == "anomaly_score"
    ]


def test_a_repeated_simulate_run_is_scored_and_alerts_like_the_first(
    test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    ensure_topics(test_settings.kafka, test_settings.topics.kafka_topics())
    env = _env(test_settings, tmp_path)
    scenario = tmp_path / "scenario.json"
    scenario.write_text(
        json.dumps({"anomalies": [{"kind": "spike", "devices": "home-*-thermostat-0", "at_s": 200, "magnitude": 12.0}]})
    )
    stream = subprocess.Popen(
        [
            *IOTWATCH,
            "stream",
            "--checkpoint",
            str(tmp_path / "ck"),
            "--archive",
            str(tmp_path / "ar"),
            "--trigger",
            "1",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    gateway = subprocess.Popen(
        [*IOTWATCH, "gateway", "--client-id", f"gw-{unique}", "--metrics-port", str(free_port())],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (tmp_path / "ck" / "commits" / "0").exists():
            assert stream.poll() is None and gateway.poll() is None, stream.stderr
            time.sleep(0.5)
        for run in (1, 2):
            truth = tmp_path / f"truth-{run}.jsonl"
            result = subprocess.run(
                [
                    *IOTWATCH,
                    "simulate",
                    "--homes",
                    "2",
                    "--vehicles",
                    "0",
                    "--mix",
                    "thermostat=1",
                    "--rate",
                    "1",
                    "--duration",
                    "300",
                    "--speedup",
                    "30",
                    "--scenario",
                    str(scenario),
                    "--ground-truth",
                    str(truth),
                    "--seq-state",
                    str(tmp_path / "seq.json"),
                    "--client-id-prefix",
                    f"sim-{unique}-{run}",
                    "--json",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert result.returncode == 0, result.stderr
            runs.append((json.loads(result.stdout), [json.loads(line) for line in truth.read_text().splitlines()]))
        (first, first_truth), (second, second_truth) = runs
        assert first["seq_state"]["carried_on"] == 0 and second["seq_state"]["carried_on"] == 2
        assert len(second_truth) == 2 and all(t["start_seq"] >= 290 for t in second_truth), second_truth
        assert second["start_ms"] > first["virtual_end_ms"] - 1000  # event time carries on too

        def alerted(truth: list[dict[str, Any]]) -> set[str]:
            found = _anomaly_alerts(test_settings)
            return {
                t["device_id"]
                for t in truth
                for a in found
                if a["device_id"] == t["device_id"] and t["start_seq"] <= a["first_seq"] <= t["end_seq"] + 3
            }

        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and alerted(second_truth) != {t["device_id"] for t in second_truth}:
            assert stream.poll() is None, stream.stderr
            time.sleep(3)
        assert alerted(first_truth) == {t["device_id"] for t in first_truth}
        assert alerted(second_truth) == {t["device_id"] for t in second_truth}, _anomaly_alerts(test_settings)
    finally:
        for process in (gateway, stream):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in (gateway, stream):
            try:
                process.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
