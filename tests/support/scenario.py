"""A small labelled scenario written straight to the raw topic, for the streaming tests."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from confluent_kafka import Producer

from iotwatch.contract.telemetry import Telemetry
from iotwatch.settings import Settings

MALFORMED = [
    b"{not json",
    b'{"v":1,"device_id":"x"}',
    b'{"v":1,"device_id":"th-0","device_type":"thermostat",'
    b'"site":"h1","seq":1,"ts":1763784000000,"metrics":{"temperature_c":NaN}}',
]


@dataclass
class Scenario:
    """What was written: readings per device, and which anomalies were injected where."""

    readings: dict[str, list[int]] = field(default_factory=dict)  # device -> seqs (first copies)
    duplicates: int = 0
    late: list[tuple[str, int]] = field(default_factory=list)
    malformed: int = 0
    expected_alerts: dict[str, str] = field(default_factory=dict)  # device -> rule
    quiet_devices: list[str] = field(default_factory=list)


def write_scenario(settings: Settings, run: str, per_device: int = 240) -> Scenario:
    rng = random.Random(7)
    t0 = int(time.time() * 1000) - 3_600_000
    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True})
    scenario = Scenario()

    def send(message: Telemetry) -> None:
        producer.produce(settings.topics.raw, key=message.device_id.encode(), value=message.to_json())

    devices = {f"th-{run}-{i}": "thermostat" for i in range(4)}
    devices[f"leak-{run}"] = "leak_sensor"
    devices[f"car-{run}"] = "vehicle_edr"
    late_device, late_seq = f"th-{run}-3", 50
    for seq in range(per_device):
        for device, kind in devices.items():
            ts = t0 + seq * 1000
            if (device, seq) == (late_device, late_seq):
                continue  # held back: it arrives after everything else
            if kind == "thermostat":
                temp = 21.0 + rng.gauss(0, 0.15)
                if device.endswith("-0") and seq == 200:
                    temp += 9.0  # spike
                if device.endswith("-1") and seq >= 190:
                    temp += 4.0  # level shift
                metrics = {
                    "temperature_c": temp,
                    "humidity_pct": 45 + rng.gauss(0, 0.5),
                    "setpoint_c": 21.0,
                    "hvac_on": 0.0,
                }
            elif kind == "leak_sensor":
                metrics = {
                    "water_detected": 1.0 if 150 <= seq < 160 else 0.0,
                    "battery_pct": 90.0,
                    "temperature_c": 18 + rng.gauss(0, 0.1),
                }
            else:
                metrics = {
                    "speed_kmh": 50 + rng.gauss(0, 1),
                    "accel_x_g": -7.5 if seq == 170 else rng.gauss(0, 0.05),
                    "coolant_temp_c": 90 + rng.gauss(0, 0.3),
                }
            send(
                Telemetry(
                    v=1,
                    device_id=device,
                    device_type=kind,
                    site=f"site-{run}",
                    seq=seq,
                    ts=ts,
                    metrics=metrics,
                    event="crash" if kind == "vehicle_edr" and seq == 170 else None,
                )
            )
            scenario.readings.setdefault(device, []).append(seq)
        if seq in (50, 120):  # transport duplicates: a device re-sends its previous reading
            device = f"th-{run}-2"
            send(
                Telemetry(
                    v=1,
                    device_id=device,
                    device_type="thermostat",
                    site=f"site-{run}",
                    seq=seq - 1,
                    ts=t0 + (seq - 1) * 1000,
                    metrics={"temperature_c": 21.0, "humidity_pct": 45.0, "setpoint_c": 21.0, "hvac_on": 0.0},
                )
            )
            scenario.duplicates += 1
    # The held-back reading arrives last: its device has moved on by more than the allowed lateness.
    send(
        Telemetry(
            v=1,
            device_id=late_device,
            device_type="thermostat",
            site=f"site-{run}",
            seq=late_seq,
            ts=t0 + late_seq * 1000,
            metrics={"temperature_c": 21.0},
        )
    )
    scenario.late.append((late_device, late_seq))
    for payload in MALFORMED:
        producer.produce(settings.topics.raw, key=f"th-{run}-0".encode(), value=payload)
        scenario.malformed += 1
    assert producer.flush(30) == 0
    scenario.expected_alerts = {
        f"th-{run}-0": "anomaly_score",
        f"th-{run}-1": "anomaly_score",
        f"leak-{run}": "water_leak",
        f"car-{run}": "crash",
    }
    scenario.quiet_devices = [f"th-{run}-2", f"th-{run}-3"]
    return scenario
