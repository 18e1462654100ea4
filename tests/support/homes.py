"""A simulated home that obeys commands over the real MQTT broker, and a command sender."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from iotwatch.clients.mqtt import make_client
from iotwatch.contract.device_commands import COMMAND_SCHEMA_VERSION, Command
from iotwatch.devices.commands import CommandChannel, DeviceCommands
from iotwatch.devices.config import SimConfig
from iotwatch.devices.simulation import Simulation
from iotwatch.settings import MqttSettings, Settings

THERMOSTAT, LEAK = "home-00000-thermostat-0", "home-00000-leak_sensor-0"
SITE = "home-00000"
VEHICLE, VEHICLE_SITE = "vehicle-00000", "fleet-000"
START_MS = int(time.time() * 1000) - 3_600_000


def home_with_faults(tmp_path: Path, *, vehicle_overheats: bool = False, ticks: int = 20) -> Simulation:
    """One home (a thermostat and a leak sensor) whose HVAC is stuck and whose pipe leaks from the
    start; with ``vehicle_overheats`` also a vehicle whose engine overheats from the start."""
    scenario = tmp_path / "faults.json"
    anomalies = [
        {"kind": "stuck_hvac", "devices": THERMOSTAT, "at_s": 0, "duration_s": 7200},
        {"kind": "water_leak", "devices": LEAK, "at_s": 0, "duration_s": 3600},
    ]
    if vehicle_overheats:
        anomalies.append({"kind": "overheating", "devices": VEHICLE, "at_s": 0, "duration_s": 7200})
    scenario.write_text(json.dumps({"anomalies": anomalies}))
    config = SimConfig(
        homes=1,
        vehicles=int(vehicle_overheats),
        mix={"thermostat": 1, "leak_sensor": 1},
        start_ms=START_MS,
        scenario=scenario,
    )
    sim = Simulation(config)
    for _ in range(ticks):
        sim.tick()
    return sim


def with_respond(settings: Settings, **respond: Any) -> Settings:
    """``settings`` with these ``[respond]`` settings changed."""
    return settings.model_copy(update={"respond": settings.respond.model_copy(update=respond)})


def mode(sim: Simulation, device_id: str) -> int:
    group = next(g for g in sim.groups if device_id in g.device_ids)
    return int(group.mode[group.device_ids.index(device_id)])


def command(device_id: str, name: str, ttl_s: float = 60.0, command_id: str | None = None) -> Command:
    now = int(time.time() * 1000)
    return Command(
        COMMAND_SCHEMA_VERSION,
        command_id or f"{name}-{time.monotonic_ns()}",
        device_id,
        name,
        now,
        now + int(ttl_s * 1000),
        "test",
    )


@dataclass
class Obeying:
    """The simulation's devices listening for commands in a thread (as ``simulate --obey-commands``)."""

    sim: Simulation
    mqtt: MqttSettings
    client_id: str
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        devices = [
            (site, g.device_type, d) for g in self.sim.groups for site, d in zip(g.sites, g.device_ids, strict=True)
        ]
        self.channel = CommandChannel(self.mqtt, self.client_id, devices)
        self.channel.connect()
        self.handler = DeviceCommands(self.channel, self.sim.obey, reported=self.sim.reported)
        self.handler.report_all()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.handler.handle_pending()
            self.sim.tick()
            time.sleep(0.02)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.channel.close()


class Replies:
    """Every command reply on the broker, as published."""

    def __init__(self, mqtt: MqttSettings, client_id: str) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        ready = threading.Event()
        self.client = make_client(mqtt, client_id)
        self.client.on_connect = lambda c, *_: c.subscribe("iot/+/+/+/commands/ack", qos=1)
        self.client.on_subscribe = lambda *_: ready.set()
        self.client.on_message = lambda _c, _u, m: self.seen.append((m.topic, json.loads(m.payload)))
        self.client.connect(mqtt.host, mqtt.port)
        self.client.loop_start()
        assert ready.wait(10)

    def of(self, command_id: str) -> list[str]:
        return [
            r["status"] + (f":{r['reason']}" if r.get("reason") else "")
            for _, r in list(self.seen)
            if r["command_id"] == command_id
        ]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def replies(stack_settings: Any, unique: str) -> Iterator[Replies]:
    watcher = Replies(stack_settings.mqtt, f"replies-{unique}")
    yield watcher
    watcher.close()
