"""Per-device state in the gateway is bounded: a flood of new device ids."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psutil
import requests

from iotwatch.application.stack.process import free_port
from iotwatch.clients.kafka import ensure_topics
from iotwatch.clients.mqtt import make_client
from iotwatch.contract.device_topics import telemetry_topic
from iotwatch.gateway.metrics import wait_healthy
from iotwatch.settings import Settings
from tests.helpers import reading
from tests.integration.gateway.test_gateway import _gateway_command, _gateway_env

WAVE = 10_000  # new device ids per wave, each wave published within a few seconds
MAX_DEVICES = 2_000  # the gateway's seq-map cap for this test
#: RSS growth allowed from the end of the first wave to the end of the third (20,000 more
#: new ids): the seq map is full after the first, so what may still grow is the contract's
#: name cache (at most 100,000 names, about 100 bytes each) and allocator noise. Measured
#: here: 91 MiB after the first wave, 3.6 MiB more after the third.
MAX_GROWTH_BYTES = 12 * 1024 * 1024


def _forwarded(port: int) -> float:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    line = next(x for x in text.splitlines() if x.startswith("iotwatch_gateway_forwarded_total"))
    return float(line.rsplit(" ", 1)[1])


def test_ten_thousand_new_device_ids_a_wave_keep_gateway_memory_bounded(
    test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    ensure_topics(test_settings.kafka, [test_settings.topics.raw, test_settings.topics.dlq])
    port = free_port()
    env = {**_gateway_env(test_settings), "IOTWATCH_GATEWAY_MAX_DEVICES": str(MAX_DEVICES)}
    log = open(tmp_path / "gateway.log", "wb")
    gateway = subprocess.Popen(
        _gateway_command(test_settings, f"gw-{unique}", port), env=env, stdout=subprocess.PIPE, stderr=log
    )
    rss: list[int] = []
    try:
        wait_healthy(port)
        client = make_client(test_settings.mqtt, f"flood-{unique}")
        client.max_queued_messages_set(0)
        client.connect(test_settings.mqtt.host, test_settings.mqtt.port)
        client.loop_start()
        started = time.monotonic()
        for wave in range(3):
            for index in range(WAVE):
                device = f"flood-{unique}-{wave}-{index}"
                info = client.publish(
                    telemetry_topic("flood", "thermostat", device), reading(device, 0, site="flood").to_json(), qos=1
                )
                if index % 2000 == 1999:
                    info.wait_for_publish(60)
            info.wait_for_publish(60)
            deadline = time.monotonic() + 60
            while _forwarded(port) < WAVE * (wave + 1) and time.monotonic() < deadline:
                time.sleep(0.2)
            rss.append(psutil.Process(gateway.pid).memory_info().rss)
        assert time.monotonic() - started < 60 * 3
        client.disconnect()
        client.loop_stop()
    finally:
        gateway.send_signal(signal.SIGTERM)
        out, _ = gateway.communicate(timeout=60)
    summary = json.loads(out)
    assert summary["forwarded"] == 3 * WAVE and summary["inflight"] == 0
    assert summary["tracked_devices"] == MAX_DEVICES
    assert summary["devices_forgotten"] == 3 * WAVE - MAX_DEVICES
    assert summary["duplicates"] == 0 and summary["seq_gaps"] == 0
    growth = rss[2] - rss[0]
    assert growth < MAX_GROWTH_BYTES, f"RSS grew {growth / 2**20:.1f} MiB over 20,000 new device ids: {rss}"
