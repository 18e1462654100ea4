"""``iotwatch gateway --processes 2``: one shared subscription, a kill -9 of one process loses nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psutil

from iotwatch.application.stack.process import free_port
from iotwatch.clients.kafka import ensure_topics
from iotwatch.gateway.metrics import wait_healthy
from iotwatch.settings import Settings
from tests.helpers import Publisher, assert_no_loss, read_all_seqs
from tests.integration.gateway.test_gateway import _gateway_command, _gateway_env


def test_two_processes_share_the_load_and_a_kill_minus_nine_loses_nothing(
    test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    ensure_topics(test_settings.kafka, [test_settings.topics.raw, test_settings.topics.dlq])
    port = free_port(count=2)
    command = [*_gateway_command(test_settings, f"gw-{unique}", port), "--processes", "2"]
    log = open(tmp_path / "gateway.log", "wb")
    supervisor = subprocess.Popen(command, env=_gateway_env(test_settings), stdout=subprocess.PIPE, stderr=log)
    try:
        wait_healthy(port)
        wait_healthy(port + 1)
        children = [
            c for c in psutil.Process(supervisor.pid).children() if "resource_tracker" not in " ".join(c.cmdline())
        ]
        assert len(children) == 2
        devices = [f"p2-{unique}-{i}" for i in range(4)]
        publisher = Publisher(test_settings.mqtt, devices, count=1500, rate_per_s=1500).start()
        time.sleep(1.5)
        victim = max(children, key=lambda c: c.pid)
        victim.send_signal(signal.SIGKILL)  # the supervisor starts it again on its persistent session
        publisher.join()
        _records, seqs = read_all_seqs(test_settings.kafka, test_settings.topics.raw, devices, 1500)
    finally:
        supervisor.send_signal(signal.SIGTERM)
        out, _ = supervisor.communicate(timeout=90)
    assert supervisor.returncode == 0
    assert_no_loss(seqs, devices, 1500)
    summary = json.loads(out)
    assert summary["processes"] == 2 and summary["restarts"] == 1
    assert summary["inflight"] == 0
    assert all(instance["received"] > 0 for instance in summary["instances"])
