"""Door/window contacts and water-leak sensors: binary state plus battery and temperature, with an
``event`` on the reading where the state changed (docs/internals.md, "Contacts and leak sensors")."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from iotwatch.contract.telemetry import DeviceType
from iotwatch.devices.group import DeviceGroup, DeviceSpec, Event
from iotwatch.devices.home.context import HomeContext
from iotwatch.devices.rng import CounterRng, normal_from

LEAK = 1
_DOOR_STREAM = 400
_LEAK_STREAM = 500


class _BinarySensorGroup(DeviceGroup):
    _stream: ClassVar[int]

    def __init__(self, specs: list[DeviceSpec], rng: CounterRng, homes: HomeContext) -> None:
        super().__init__(specs, rng)
        self.homes = homes
        self.home = np.array([s.home for s in specs], dtype=np.int64)
        u = rng.uniform(self.uid, np.full(self.size, -1, dtype=np.int64), self._stream, 2)
        self.battery = 40.0 + 60.0 * u[:, 0]
        self.outdoor_share = 0.1 + 0.3 * u[:, 1]  # how much the mounting spot follows outdoors
        self.state = np.zeros(self.size, dtype=bool)

    def _common(self, idx: np.ndarray, t_ms: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        home = self.home[idx]
        share = self.outdoor_share[idx]
        temp = (1.0 - share) * self.homes.room_temp_c[home] + share * self.homes.outside_temp(home, t_ms)
        battery = np.maximum(self.battery[idx] - self.dt_s(idx) * 2e-7, 0.0)  # ~0.6 %/year
        self.battery[idx] = battery
        return battery, temp + 0.1 * noise

    @staticmethod
    def _events(before: np.ndarray, after: np.ndarray, on: str, off: str) -> list[Event]:
        changed = np.flatnonzero(before != after)
        return [(int(r), on if after[r] else off, None) for r in changed]


class DoorSensorGroup(_BinarySensorGroup):
    device_type = DeviceType.DOOR_SENSOR.value
    metrics = ("open", "battery_pct", "temperature_c")
    _stream: ClassVar[int] = _DOOR_STREAM
    draws: ClassVar[int] = 4

    def __init__(self, specs: list[DeviceSpec], rng: CounterRng, homes: HomeContext) -> None:
        super().__init__(specs, rng, homes)
        self.close_at = np.zeros(self.size, dtype=np.int64)

    def step(self, idx: np.ndarray, t_ms: np.ndarray, seq: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, list[Event]]:
        noise = normal_from(u[:, 2:4])[:, 0]
        people, awake = self.homes.schedule(self.home[idx], t_ms)
        before = self.state[idx]
        per_hour = np.where((people > 0) & awake, 4.0, 0.2)
        opens = ~before & (u[:, 0] < per_hour * self.dt_s(idx) / 3600.0)
        closes = before & (t_ms >= self.close_at[idx])
        after = (before | opens) & ~closes
        self.close_at[idx] = np.where(opens, t_ms + (5_000 + 55_000 * u[:, 1]).astype(np.int64), self.close_at[idx])
        self.state[idx] = after
        battery, temp = self._common(idx, t_ms, noise)
        values = np.column_stack([after.astype(np.float64), battery, temp])
        return values, self._events(before, after, "opened", "closed")


class LeakSensorGroup(_BinarySensorGroup):
    device_type = DeviceType.LEAK_SENSOR.value
    metrics = ("water_detected", "battery_pct", "temperature_c")
    _stream: ClassVar[int] = _LEAK_STREAM
    draws: ClassVar[int] = 2

    def step(self, idx: np.ndarray, t_ms: np.ndarray, seq: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, list[Event]]:
        noise = normal_from(u)[:, 0]
        before = self.state[idx]
        after = self.mode[idx] == LEAK
        self.state[idx] = after
        battery, temp = self._common(idx, t_ms, noise)
        temp = temp - 1.5 * after  # the water cools the probe a little
        values = np.column_stack([after.astype(np.float64), battery, temp])
        return values, self._events(before, after, "leak_detected", "leak_cleared")
