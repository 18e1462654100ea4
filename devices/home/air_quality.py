"""Air quality: CO2 from a single-zone mass balance (people exhale, ventilation dilutes)
and PM2.5 from outdoor background plus cooking peaks that decay."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from iotwatch.contract.telemetry import DeviceType
from iotwatch.devices.group import DeviceGroup, DeviceSpec, Event
from iotwatch.devices.home.context import HomeContext
from iotwatch.devices.rng import CounterRng, normal_from

_STREAM = 300
OUTDOOR_CO2_PPM = 420.0
#: CO2 one resting adult adds per hour to a 1 m^3 space, ppm * m^3 / h (~18 L/h exhaled)
_CO2_PER_PERSON = 18_000.0


class AirQualityGroup(DeviceGroup):
    device_type = DeviceType.AIR_QUALITY.value
    metrics = ("co2_ppm", "pm25_ugm3", "temperature_c")
    draws: ClassVar[int] = 6

    def __init__(self, specs: list[DeviceSpec], rng: CounterRng, homes: HomeContext) -> None:
        super().__init__(specs, rng)
        self.homes = homes
        self.home = np.array([s.home for s in specs], dtype=np.int64)
        u = rng.uniform(self.uid, np.full(self.size, -1, dtype=np.int64), _STREAM, 3)
        self.air_changes_per_h = 0.3 + 0.9 * u[:, 0]
        self.outdoor_pm = 4.0 + 14.0 * u[:, 1]
        self.co2 = OUTDOOR_CO2_PPM + 200.0 * u[:, 2]
        self.pm = self.outdoor_pm.copy()

    def step(self, idx: np.ndarray, t_ms: np.ndarray, seq: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, list[Event]]:
        homes, home = self.homes, self.home[idx]
        dt_h = self.dt_s(idx) / 3600.0
        noise = normal_from(u)
        people, awake = homes.schedule(home, t_ms)
        hours = homes.local_hours(home, t_ms)
        ach = self.air_changes_per_h[idx]
        co2 = self.co2[idx]
        gain = people * _CO2_PER_PERSON / homes.room_volume_m3[home] * np.where(awake, 1.0, 0.7)
        co2 = co2 + (gain - ach * (co2 - OUTDOOR_CO2_PPM)) * np.minimum(dt_h, 1.0)
        cooking = (people > 0) & awake & ((np.abs(hours - 7.5) < 0.4) | (np.abs(hours - 19.0) < 0.6))
        pm = self.pm[idx]
        pm = pm + (cooking * 60.0 - (ach + 0.5) * (pm - self.outdoor_pm[idx])) * np.minimum(dt_h, 1.0)
        self.co2[idx], self.pm[idx] = co2, pm
        values = np.column_stack(
            [
                np.maximum(co2 + 8.0 * noise[:, 0], 380.0),
                np.maximum(pm + 0.8 * noise[:, 1], 0.0),
                homes.room_temp_c[home] + 0.1 * noise[:, 2],
            ]
        )
        return values, []
