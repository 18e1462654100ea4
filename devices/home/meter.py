"""Smart meter / plug: household power from base load, fridge cycles, people, meals, HVAC.

Voltage sags a little with load and with the evening peak; current is P / (V * pf);
energy integrates power. Kettle-like appliance bursts arrive at random.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from iotwatch.contract.telemetry import DeviceType
from iotwatch.devices.group import DeviceGroup, DeviceSpec, Event
from iotwatch.devices.home.context import HomeContext
from iotwatch.devices.rng import CounterRng, normal_from

_STREAM = 200


class SmartMeterGroup(DeviceGroup):
    device_type = DeviceType.SMART_METER.value
    metrics = ("power_w", "voltage_v", "current_a", "energy_kwh")
    draws: ClassVar[int] = 6

    def __init__(self, specs: list[DeviceSpec], rng: CounterRng, homes: HomeContext) -> None:
        super().__init__(specs, rng)
        self.homes = homes
        self.home = np.array([s.home for s in specs], dtype=np.int64)
        u = rng.uniform(self.uid, np.full(self.size, -1, dtype=np.int64), _STREAM, 5)
        self.energy = 1000.0 + 30000.0 * u[:, 0]
        self.fridge_phase = u[:, 1]
        self.hvac_w = 1200.0 + 2300.0 * u[:, 2]
        self.power_factor = 0.9 + 0.08 * u[:, 3]
        self.nominal_v = 230.0 + 4.0 * (u[:, 4] - 0.5)

    def step(self, idx: np.ndarray, t_ms: np.ndarray, seq: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, list[Event]]:
        homes, home = self.homes, self.home[idx]
        dt = self.dt_s(idx)
        noise = normal_from(u[:, :4])
        burst = u[:, 4:6]
        people, awake = homes.schedule(home, t_ms)
        hours = homes.local_hours(home, t_ms)
        fridge = np.mod(t_ms / (50.0 * 60_000.0) + self.fridge_phase[idx], 1.0) < 0.35
        meals = np.exp(-0.5 * ((hours - 7.5) / 0.4) ** 2) + 1.3 * np.exp(-0.5 * ((hours - 19.0) / 0.6) ** 2)
        evening_light = ((hours > 17.5) & (hours < 23.5)).astype(np.float64)
        occupied = (people > 0) & awake
        power = (
            homes.base_load_w[home]
            + 110.0 * fridge
            + occupied * (90.0 * people + 180.0 * evening_light + 1800.0 * meals)
            + homes.hvac_on[home] * self.hvac_w[idx]
            # a kettle or hair dryer: about three an hour when someone is up
            + (burst[:, 0] < dt * occupied * 3.0 / 3600.0) * (1500.0 + 800.0 * burst[:, 1])
        )
        power = np.maximum(power * (1.0 + 0.01 * noise[:, 0]), 0.0)
        evening_peak = np.exp(-0.5 * ((hours - 19.0) / 1.5) ** 2)
        voltage = self.nominal_v[idx] - 3.0 * evening_peak - power / 2500.0 + 0.4 * noise[:, 1]
        current = power / (voltage * self.power_factor[idx])
        energy = self.energy[idx] + power * dt / 3.6e6
        self.energy[idx] = energy
        return np.column_stack([power, voltage, current, energy]), []
