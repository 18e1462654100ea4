"""Ctrl-C and SIGTERM, sent to a long-running command's process group as a terminal or a
service manager does, end it with exit 0, its final totals and no traceback; and each says
on start what it is doing and where."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from iotwatch.application.stack.process import free_port
from iotwatch.clients.kafka import ensure_topics
from iotwatch.settings import Settings
from tests.conftest import REPO_ROOT
from tests.helpers import reading, user_env

SIGNALS = [signal.SIGINT, signal.SIGTERM]


def _env(settings: Settings) -> dict[str, str]:
    env = user_env()
    return {**env, **settings.topics.as_environment(), "IOTWATCH_INFLUX_URL": ""}


def stop_by_signal(
    argv: list[str], env: dict[str, str], started_line: str, sig: signal.Signals, *, start_timeout_s: float = 60
) -> tuple[int, str, str]:
    """Run ``iotwatch ARGV`` in its own process group, wait for ``started_line`` on stderr (what it
    says on start), send ``sig`` to the group; exit status, stdout and stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "iotwatch.application", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stderr is not None
    seen: list[str] = []
    try:
        deadline = time.monotonic() + start_timeout_s
        while not any(started_line in line for line in seen):
            assert time.monotonic() < deadline and process.poll() is None, f"no {started_line!r}: {''.join(seen)}"
            if select.select([process.stderr], [], [], 0.5)[0]:
                seen.append(process.stderr.readline())
        time.sleep(2)  # running, not starting
        os.killpg(process.pid, sig)
        out, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, out, "".join(seen) + err


def assert_clean(code: int, out: str, err: str, totals: str) -> None:
    assert code == 0, err
    assert totals in out, out + err
    assert "Traceback" not in err and "Traceback" not in out, err


CommandCase = Callable[[Settings, str, Path], tuple[list[str], str, str]]


def _gateway(settings: Settings, unique: str, _home: Path) -> tuple[list[str], str, str]:
    ensure_topics(settings.kafka, [settings.topics.raw, settings.topics.dlq])
    argv = ["gateway", "--mqtt", settings.mqtt.url, "--kafka", settings.kafka.bootstrap_servers]
    argv += ["--client-id", f"gw-{unique}", "--metrics-port", str(free_port())]
    return argv, f"gateway gw-{unique}: MQTT", "gateway stopped: received"


def _simulate(settings: Settings, _unique: str, home: Path) -> tuple[list[str], str, str]:
    argv = ["simulate", "--mqtt", settings.mqtt.url, "--homes", "1", "--vehicles", "0", "--mix", "thermostat=1"]
    argv += ["--seq-state", str(home / "seq.json")]
    return argv, "simulate: 1 thermostat publishing to MQTT", "total"


def _forward(settings: Settings, unique: str, _home: Path) -> tuple[list[str], str, str]:
    ensure_topics(settings.kafka, [settings.topics.alerts])
    argv = ["alerts", "forward", "--kafka", settings.kafka.bootstrap_servers, "--group", f"fw-{unique}"]
    argv += ["--webhook", "http://127.0.0.1:9/hook", "--state-dir", str(_home / "forward")]
    return argv, "alerts forward: state rebuilt", "alerts forward: alert records 0"


def _forward_routed(settings: Settings, _unique: str, home: Path) -> tuple[list[str], str, str]:
    routes = REPO_ROOT / "deploy" / "oncall" / "routes.toml"  # the shipped example: nothing is posted
    argv = ["alerts", "forward", "--kafka", settings.kafka.bootstrap_servers, "--routes", str(routes)]
    argv += ["--state-dir", str(home / "forward")]
    return argv, "alerts forward: state rebuilt", "alerts forward: "


def _respond(settings: Settings, _unique: str, _home: Path) -> tuple[list[str], str, str]:
    argv = ["respond", "--mqtt", settings.mqtt.url, "--kafka", settings.kafka.bootstrap_servers]
    return argv, "respond: following " + settings.topics.alerts, "respond: "


COMMANDS: dict[str, CommandCase] = {
    "gateway": _gateway,
    "simulate": _simulate,
    "alerts forward": _forward,
    "alerts forward --routes": _forward_routed,
    "respond": _respond,
}


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_signal_to_the_process_group_ends_the_command_with_its_totals(
    command: str, sig: signal.Signals, test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    argv, started, totals = COMMANDS[command](test_settings, unique, tmp_path)
    code, out, err = stop_by_signal(argv, _env(test_settings), started, sig)
    assert_clean(code, out, err, totals)
    if command == "gateway":
        # a clean stop is not a lost connection
        assert "connection lost" not in err and " WARNING gateway." not in err, err


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_to_the_stream_process_group_stops_spark_cleanly(
    sig: signal.Signals, test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    ensure_topics(test_settings.kafka, [test_settings.topics.raw])
    producer = Producer(test_settings.kafka.client_config())
    for seq in range(20):
        message = reading(f"sig-{unique}", seq)
        producer.produce(test_settings.topics.raw, message.to_json(), key=message.key())
    assert producer.flush(30) == 0
    argv = ["stream", "--kafka", test_settings.kafka.bootstrap_servers, "--influx", ""]
    argv += ["--checkpoint", str(tmp_path / "checkpoint"), "--archive", str(tmp_path / "archive")]
    # stopped while running: after its first micro-batch with records
    code, out, err = stop_by_signal(argv, _env(test_settings), "stream: batch=", sig, start_timeout_s=180)
    assert_clean(code, out, err, "iotwatch stream: stopped after")
    assert " ERROR " not in err, err


@pytest.mark.timeout(400)
def test_sigterm_to_chaos_stops_every_process_it_started(tmp_path: Path) -> None:
    """``kill PID`` of `iotwatch chaos` (its servers and components run in sessions of their
    own, out of reach of a signal to its group) unwinds it as Ctrl-C does: nothing it started
    is left running."""
    import psutil

    process = subprocess.Popen(
        [sys.executable, "-m", "iotwatch.application", "chaos", "--duration", "300", "--rate", "200", "--homes", "5"]
        + ["--out", str(tmp_path / "run")],
        env=user_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while not any("starting the pipeline" in line for line in seen):
            assert time.monotonic() < deadline and process.poll() is None, "".join(seen)
            if select.select([process.stderr], [], [], 0.5)[0]:
                seen.append(process.stderr.readline())
        time.sleep(5)  # the job and the gateway starting
        started = psutil.Process(process.pid).children(recursive=True)
        assert len(started) >= 4, started  # mosquitto, Kafka, InfluxDB, the job...
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    _gone, alive = psutil.wait_procs(started, timeout=30)
    left = [(p.pid, p.name()) for p in alive]
    for proc in alive:  # not to leave them to the rest of the suite
        proc.kill()
    assert not left, left
