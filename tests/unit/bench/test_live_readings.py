"""``bench stream``'s readings: what the templates encode is the contract's thermostat reading,
device by device, spikes included."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from iotwatch.application.bench.stream import SPIKE_C, TEMPERATURE_C, LiveReadings
from iotwatch.contract.device_topics import telemetry_topic
from iotwatch.contract.metric_catalog import KNOWN_METRICS
from iotwatch.contract.telemetry import Telemetry, decode_telemetry

TS = 1_796_000_000_000


@pytest.mark.parametrize("device", [0, 7, 13, 1999])
def test_a_templated_reading_decodes_to_the_contracts_thermostat_reading(device: int) -> None:
    readings = LiveReadings(device + 1)
    metrics = {"temperature_c": 21.123456, "humidity_pct": 44.5, "setpoint_c": 21.0, "hvac_on": 0.0}
    built = Telemetry(
        v=1,
        device_id=f"bench-th-{device}",
        device_type="thermostat",
        site=f"bench-{device % 10}",
        seq=42,
        ts=TS,
        metrics=metrics,
    )
    temperature, humidity = built.metrics["temperature_c"], built.metrics["humidity_pct"]
    decoded = decode_telemetry(
        readings.payload(device, 42, TS, temperature, humidity), now_ms=TS, metrics_of=KNOWN_METRICS
    )
    assert msgspec.structs.replace(decoded, metrics={}) == msgspec.structs.replace(built, metrics={})
    assert decoded.metrics == pytest.approx(built.metrics, abs=1e-6)
    assert readings.keys[device] == built.device_id.encode()
    assert readings.mqtt_topics[device] == telemetry_topic(built.site, built.device_type, built.device_id).encode()


def test_a_round_spikes_exactly_the_devices_it_is_told_to() -> None:
    readings = LiveReadings(400)
    spikes = np.zeros(400, dtype=bool)
    spikes[[3, 100, 397]] = True
    temperature, humidity = (np.array(values) for values in readings.round(spikes))
    assert (temperature[spikes] > TEMPERATURE_C + SPIKE_C - 2).all()
    assert (temperature[~spikes] < TEMPERATURE_C + 2).all()
    assert 40 < humidity.mean() < 50
