"""Thermostat: room temperature from a one-node thermal model with HVAC hysteresis (docs/internals.md,
"Thermostat")."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from iotwatch.contract.telemetry import DeviceType
from iotwatch.devices.group import DeviceGroup, DeviceSpec, Event
from iotwatch.devices.home.context import HomeContext
from iotwatch.devices.rng import CounterRng, normal_from

HVAC_STUCK = 1
_STREAM = 100


class ThermostatGroup(DeviceGroup):
    device_type = DeviceType.THERMOSTAT.value
    metrics = (
        "temperature_c",
        "humidity_pct",
        "setpoint_c",
        "hvac_on",
        "hvac_cooling",
        "outside_temperature_c",
    )
    draws: ClassVar[int] = 6

    def __init__(self, specs: list[DeviceSpec], rng: CounterRng, homes: HomeContext) -> None:
        super().__init__(specs, rng)
        self.homes = homes
        self.home = np.array([s.home for s in specs], dtype=np.int64)
        u = rng.uniform(self.uid, np.full(self.size, -1, dtype=np.int64), _STREAM, 2)
        self.temp = homes.comfort_c[self.home] + (u[:, 0] - 0.5)
        self.humidity = 35.0 + 20.0 * u[:, 1]
        self.hvac = np.zeros(self.size, dtype=bool)
        self.setpoint_override = np.full(self.size, np.nan)  # NaN: the household's schedule
        self.setpoint = homes.comfort_c[self.home].astype(float)  # the last one in force, for the twin

    def step(self, idx: np.ndarray, t_ms: np.ndarray, seq: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, list[Event]]:
        homes, home = self.homes, self.home[idx]
        dt = self.dt_s(idx)
        noise = normal_from(u)
        t_out = homes.outside_temp(home, t_ms)
        people, awake = homes.schedule(home, t_ms)
        heating = homes.heating[home]
        comfort = homes.comfort_c[home]
        setback = np.where(heating, -3.0, 3.0)
        setpoint = np.where(awake & (people > 0), comfort, comfort + setback)
        override = self.setpoint_override[idx]
        setpoint = np.where(np.isnan(override), setpoint, override)
        self.setpoint[idx] = setpoint
        temp, hvac = self.temp[idx], self.hvac[idx]
        # hysteresis control, or always on when stuck
        low, high = setpoint - 0.3, setpoint + 0.3
        want = np.where(
            heating,
            np.where(temp < low, True, np.where(temp > high, False, hvac)),
            np.where(temp > high, True, np.where(temp < low, False, hvac)),
        )
        hvac = want | (self.mode[idx] == HVAC_STUCK)
        # heat flows, degC per hour; the heater's output falls as the room nears 40 degC
        # and a cooler's as it nears 12 degC
        power = homes.hvac_power_c_per_h[home]
        hvac_flow = (
            np.where(
                heating,
                power * np.clip((40.0 - temp) / 10.0, 0.0, 1.0),
                -power * np.clip((temp - 12.0) / 8.0, 0.0, 1.0),
            )
            * hvac
        )
        flow = (t_out - temp) / homes.insulation_tau_h[home] + 0.12 * people + hvac_flow
        temp = temp + flow * dt / 3600.0 + 0.004 * np.sqrt(dt) * noise[:, 0]
        target_rh = 40.0 + 2.5 * people - np.where(heating, 0.0, 8.0) * hvac
        humidity = self.humidity[idx]
        humidity = humidity + (target_rh - humidity) * np.minimum(dt / 1800.0, 1.0) + 0.05 * np.sqrt(dt) * noise[:, 1]
        humidity = np.clip(humidity, 5.0, 95.0)
        self.temp[idx], self.hvac[idx], self.humidity[idx] = temp, hvac, humidity
        homes.hvac_on[home] = hvac
        homes.room_temp_c[home] = temp
        cooling = (~heating).astype(np.float64)
        values = np.column_stack(
            [temp + 0.03 * noise[:, 2], humidity, setpoint, hvac.astype(np.float64), cooling, t_out]
        )
        return values, []
