"""Vehicle event data recorders: drive cycles, a route, and crash-triggered EDR events
(docs/internals.md, "Vehicles")."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from iotwatch.contract.telemetry import DeviceType
from iotwatch.devices.group import DeviceGroup, DeviceSpec, Event
from iotwatch.devices.rng import CounterRng, normal_from

HARSH_BRAKING = 1
CRASH = 2
_CRASHED = 3  # internal: after the impact
OVERHEATING = 4
#: Limp mode's speed cap (km/h) and throttle cap (%).
LIMP_KMH = 40.0
LIMP_THROTTLE_PCT = 30.0

IDLE, ACCEL, CRUISE, BRAKE = 0, 1, 2, 3
G = 9.80665
_STREAM = 600
_WAYPOINTS = 6
_M_PER_DEG = 111_320.0
#: (lat, lon) of home towns vehicles start around
_TOWNS = np.array(
    [
        (52.52, 13.40),
        (48.14, 11.58),
        (51.51, -0.13),
        (40.42, -3.70),
        (45.46, 9.19),
        (59.33, 18.07),
        (47.37, 8.54),
        (50.08, 14.44),
        (41.39, 2.17),
        (53.35, -6.26),
    ]
)
#: rpm per km/h in each gear, and the speeds (km/h) where gears change up
_GEAR_RATIO = np.array([110.0, 62.0, 44.0, 34.0, 28.0, 24.0])
_GEAR_UP_KMH = np.array([15.0, 30.0, 48.0, 65.0, 85.0])

DEFAULT_THRESHOLD_G = 4.0
DEFAULT_PRE_EVENT_S = 5.0


class VehicleGroup(DeviceGroup):
    device_type = DeviceType.VEHICLE_EDR.value
    metrics = (
        "speed_kmh",
        "engine_rpm",
        "throttle_pct",
        "brake_pct",
        "steering_angle_deg",
        "accel_x_g",
        "accel_y_g",
        "accel_z_g",
        "lat_deg",
        "lon_deg",
        "heading_deg",
        "coolant_temp_c",
        "fuel_level_pct",
    )
    draws: ClassVar[int] = 14

    def __init__(
        self,
        specs: list[DeviceSpec],
        rng: CounterRng,
        *,
        threshold_g: float = DEFAULT_THRESHOLD_G,
        pre_event_s: float = DEFAULT_PRE_EVENT_S,
    ) -> None:
        super().__init__(specs, rng)
        n = self.size
        self.threshold_g = threshold_g
        self.pre_event_s = pre_event_s
        u = rng.uniform(self.uid, np.full(n, -1, dtype=np.int64), _STREAM, 8)
        town = _TOWNS[(u[:, 0] * len(_TOWNS)).astype(int)]
        radius_m = 1500.0 + 6000.0 * u[:, 1]
        self.highway = u[:, 2] < 0.3
        # a loop of waypoints around the town centre, slightly irregular
        angles = (np.arange(_WAYPOINTS)[None, :] / _WAYPOINTS + u[:, 3:4]) * 2 * np.pi
        wobble = 0.75 + 0.5 * rng.uniform(self.uid, np.full(n, -2, dtype=np.int64), _STREAM, _WAYPOINTS)
        north = radius_m[:, None] * wobble * np.cos(angles)
        east = radius_m[:, None] * wobble * np.sin(angles)
        self.wp_lat = town[:, 0:1] + north / _M_PER_DEG
        self.wp_lon = town[:, 1:2] + east / (_M_PER_DEG * np.cos(np.radians(town[:, 0:1])))
        self.wp = np.zeros(n, dtype=np.int64)
        self.lat = self.wp_lat[:, -1].copy()
        self.lon = self.wp_lon[:, -1].copy()
        self.heading = np.zeros(n)  # radians, clockwise from north
        self.speed = np.zeros(n)  # m/s
        self.target = np.zeros(n)
        self.phase = np.zeros(n, dtype=np.int8)
        self.phase_until = np.array([s.first_due_ms for s in specs], dtype=np.int64) + (u[:, 4] * 20_000).astype(
            np.int64
        )
        self.decel = np.full(n, 2.5)
        self.coolant = 12.0 + 12.0 * u[:, 5]
        self.ambient = self.coolant.copy()
        self.fuel = 25.0 + 75.0 * u[:, 6]
        self.crash_started = np.zeros(n, dtype=bool)
        self.limp = np.zeros(n, dtype=bool)
        # EDR ring buffer of final readings: (vehicles, slots, 1 + metrics), column 0 is ts
        hz = 1000.0 / max(float(self.interval.min()), 1.0) if n else 1.0
        self.slots = max(1, int(math.ceil(pre_event_s * hz)))
        self.buffer = np.full((n, self.slots, 1 + len(self.metrics)), np.nan)
        self.filled = np.zeros(n, dtype=np.int64)  # readings written so far
        self.lockout_until = np.zeros(n, dtype=np.int64)

    # -- physics ---------------------------------------------------------------------------

    def step(self, idx: np.ndarray, t_ms: np.ndarray, seq: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, list[Event]]:
        dt = self.dt_s(idx)
        noise = normal_from(u[:, 4:14])
        phase, v, target = self.phase[idx].copy(), self.speed[idx], self.target[idx]
        until, decel, mode = self.phase_until[idx].copy(), self.decel[idx].copy(), self.mode[idx]
        highway = self.highway[idx]
        expired = t_ms >= until

        # phase transitions
        go = (phase == IDLE) & expired
        new_target = np.where(highway, 80.0 + 45.0 * u[:, 0], 30.0 + 30.0 * u[:, 0]) / 3.6
        target = np.where(go, new_target, target)
        phase = np.where(go, ACCEL, phase)
        reached = (phase == ACCEL) & (v >= target - 0.3)
        phase = np.where(reached, CRUISE, phase)
        until = np.where(reached, t_ms + (15_000 + 150_000 * u[:, 1]).astype(np.int64), until)
        stop = (phase == CRUISE) & (t_ms >= until)
        # most cruises end in a stop; some just change speed
        resume = stop & (u[:, 2] < 0.35)
        target = np.where(resume, new_target, target)
        phase = np.where(resume, ACCEL, np.where(stop, BRAKE, phase))
        decel = np.where(stop & ~resume, 1.5 + 2.0 * u[:, 3], decel)

        limp = self.limp[idx]
        target = np.where(limp, np.minimum(target, LIMP_KMH / 3.6), target)

        harsh = (mode == HARSH_BRAKING) & (v > 1.0) & (phase != BRAKE)
        phase = np.where(harsh, BRAKE, phase)
        decel = np.where(harsh, (0.7 + 0.25 * u[:, 3]) * G, decel)

        # longitudinal dynamics
        accel = np.zeros_like(v)
        acc_phase = phase == ACCEL
        accel = np.where(acc_phase, np.clip(2.8 * (1.0 - v / np.maximum(target, 1.0)) + 0.6, 0.4, 3.0), accel)
        accel = np.where(phase == CRUISE, 0.25 * (target - v) + 0.15 * noise[:, 0], accel)
        accel = np.where(phase == BRAKE, -decel, accel)
        v_new = np.maximum(v + accel * dt, 0.0)
        stopped = (phase == BRAKE) & (v_new <= 0.0)
        accel = np.where(stopped, -v / dt, accel)
        phase = np.where(stopped, IDLE, phase)
        until = np.where(stopped, t_ms + (3_000 + 40_000 * u[:, 1]).astype(np.int64), until)

        # crash: armed until moving, then a ~100 ms impact pulse, then stopped engine-off
        impact = (mode == CRASH) & ~self.crash_started[idx] & (v > 15.0 / 3.6)
        crashed = ((mode == CRASH) & self.crash_started[idx]) | impact
        pulse_g = np.clip(v / 0.1 / G, 1.2 * self.threshold_g, 45.0)
        accel = np.where(impact, -pulse_g * G, accel)
        v_new = np.where(crashed, 0.0, v_new)
        phase = np.where(crashed, IDLE, phase)
        until = np.where(crashed, t_ms + 60_000, until)
        self.crash_started[idx] = np.where(mode == CRASH, crashed, False)

        # steering toward the next waypoint
        lat, lon, heading = self.lat[idx], self.lon[idx], self.heading[idx]
        wp = self.wp[idx]
        d_north = (self.wp_lat[idx, wp] - lat) * _M_PER_DEG
        d_east = (self.wp_lon[idx, wp] - lon) * _M_PER_DEG * np.cos(np.radians(lat))
        wanted = np.arctan2(d_east, d_north)
        error = np.mod(wanted - heading + np.pi, 2 * np.pi) - np.pi
        max_yaw = np.minimum(0.5, 3.5 / np.maximum(v_new, 1.0))  # rad/s, tighter when slow
        yaw_rate = np.where(v_new > 0.1, np.clip(error / np.maximum(dt, 0.5), -max_yaw, max_yaw), 0.0)
        heading = np.mod(heading + yaw_rate * dt, 2 * np.pi)
        distance = (v + v_new) * 0.5 * dt
        lat = lat + distance * np.cos(heading) / _M_PER_DEG
        lon = lon + distance * np.sin(heading) / (_M_PER_DEG * np.cos(np.radians(lat)))
        arrived = np.hypot(d_north, d_east) < 40.0
        self.wp[idx] = np.where(arrived, (wp + 1) % _WAYPOINTS, wp)
        # road-wheel angle limited by the steering lock (+-36 deg), times a 15:1 steering ratio
        steering = np.clip(np.degrees(np.arctan(2.7 * yaw_rate / np.maximum(v_new, 1.0))), -36.0, 36.0) * 15.0

        # engine and pedals
        kmh = v_new * 3.6
        gear = np.searchsorted(_GEAR_UP_KMH, kmh)
        engine_on = ~crashed
        throttle = np.where(
            acc_phase,
            35.0 + 45.0 * np.clip(accel / 3.0, 0.0, 1.0),
            np.where(phase == CRUISE, np.clip(15.0 + 0.2 * kmh + 8.0 * accel, 0.0, 100.0), 0.0),
        )
        throttle = np.clip(throttle + 1.5 * noise[:, 1], 0.0, np.where(limp, LIMP_THROTTLE_PCT, 100.0)) * engine_on
        brake = np.where(
            phase == BRAKE, np.clip(decel / G * 110.0, 0.0, 100.0), np.where((phase == IDLE) & engine_on, 30.0, 0.0)
        )
        rpm = np.where(
            engine_on, np.maximum(780.0 + 15.0 * noise[:, 2], kmh * _GEAR_RATIO[gear] + 12.0 * throttle), 0.0
        )
        coolant = self.coolant[idx]
        overheating = (mode == OVERHEATING) & ~limp
        coolant_target = np.where(
            engine_on, np.where(overheating, 116.0 + 0.08 * throttle, 88.0 + 0.04 * throttle), self.ambient[idx]
        )
        # an overheating engine heats fast; limp mode's light load lets it cool as fast
        coolant = coolant + (coolant_target - coolant) * np.minimum(dt / np.where(overheating | limp, 90.0, 240.0), 1.0)
        fuel = self.fuel[idx] - dt * engine_on * (2e-4 + 3e-5 * throttle + 1.5e-6 * kmh * kmh / 10.0)
        fuel = np.where(fuel < 6.0, 95.0 + 5.0 * u[:, 3], fuel)  # refuelled

        accel_x = accel / G + 0.01 * noise[:, 3]
        accel_y = v_new * yaw_rate / G + 0.01 * noise[:, 4]
        accel_z = 1.0 + 0.02 * noise[:, 3] * noise[:, 4] + 0.3 * impact

        self.phase[idx], self.speed[idx], self.target[idx] = phase, v_new, target
        self.phase_until[idx], self.decel[idx] = until, decel
        self.lat[idx], self.lon[idx], self.heading[idx] = lat, lon, heading
        self.coolant[idx], self.fuel[idx] = coolant, fuel
        values = np.column_stack(
            [
                kmh,
                rpm,
                throttle,
                brake,
                steering,
                accel_x,
                accel_y,
                accel_z,
                lat,
                lon,
                np.degrees(heading),
                coolant,
                fuel,
            ]
        )
        return values, []

    # -- event data recorder -------------------------------------------------------------------

    def finalize(self, idx: np.ndarray, t_ms: np.ndarray, seq: np.ndarray, values: np.ndarray) -> list[Event]:
        events: list[Event] = []
        ax = values[:, self.metric_index["accel_x_g"]]
        triggered = np.flatnonzero((ax <= -self.threshold_g) & (t_ms >= self.lockout_until[idx]))
        for row in triggered.tolist():
            i = int(idx[row])
            events.append((row, "crash", self._event_data(i, float(ax[row]))))
            self.lockout_until[i] = int(t_ms[row]) + 10_000
        slot = self.filled[idx] % self.slots
        rounded = np.empty_like(values)
        for j, d in enumerate(self.decimals.tolist()):
            rounded[:, j] = np.round(values[:, j], d)
        self.buffer[idx, slot, 0] = t_ms
        self.buffer[idx, slot, 1:] = rounded
        self.filled[idx] += 1
        return events

    def _event_data(self, i: int, trigger_g: float) -> dict[str, Any]:
        """The recorder's pre-event buffer, oldest first, as columns."""
        count = int(min(self.filled[i], self.slots))
        order = [(int(self.filled[i]) - count + k) % self.slots for k in range(count)]
        rows = self.buffer[i, order]
        readings: dict[str, Any] = {"ts": [int(x) for x in rows[:, 0]]}
        for j, metric in enumerate(self.metrics):
            readings[metric] = rows[:, 1 + j].tolist()
        return {
            "trigger": {"metric": "accel_x_g", "value_g": round(trigger_g, 3), "threshold_g": self.threshold_g},
            "pre_event_s": self.pre_event_s,
            "samples": count,
            "readings": readings,
        }
