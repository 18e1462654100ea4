"""What the devices of one home share: climate, occupancy and the HVAC's state (docs/internals.md,
"Home context")."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from iotwatch.devices.rng import CounterRng, Floats

__all__ = ["HomeContext"]

HOUR_MS = 3_600_000.0
DAY_MS = 24 * HOUR_MS
_TWO_PI = 2.0 * np.pi
# rng streams used for home set-up (the home's uid is its index in the fleet)
_SETUP_STREAM = 9000
_DAILY_STREAM = 9100


class HomeContext:
    """Per-home parameters as arrays (index = the home's position in this shard)."""

    def __init__(self, home_uids: list[int], rng: CounterRng) -> None:
        self.rng = rng
        n = len(home_uids)
        self.uid = np.array(home_uids, dtype=np.uint64)
        u = rng.uniform(self.uid, np.zeros(n, dtype=np.int64), _SETUP_STREAM, 12)
        self.outside_mean_c = -2.0 + 26.0 * u[:, 0]  # climate/season of this home
        self.outside_amp_c = 3.0 + 5.0 * u[:, 1]
        self.tz_shift_h = np.floor(u[:, 2] * 3.0) - 1.0  # local-time offset -1..+1 h
        self.people = 1 + np.floor(u[:, 3] * 4.0)  # 1..4
        self.works_away = u[:, 4] < 0.7
        self.weather_phase = _TWO_PI * u[:, 5:7]
        self.insulation_tau_h = 5.0 + 10.0 * u[:, 7]  # thermal time constant
        self.hvac_power_c_per_h = 2.5 + 2.5 * u[:, 8]
        self.heating = self.outside_mean_c < 17.0  # else the HVAC cools
        self.comfort_c = np.where(self.heating, 20.0 + 2.0 * u[:, 9], 23.0 + 2.0 * u[:, 9])
        self.room_volume_m3 = 40.0 + 80.0 * u[:, 10]
        self.base_load_w = 60.0 + 140.0 * u[:, 11]
        # shared mutable state, written by the thermostat, read by meter and air quality
        self.hvac_on = np.zeros(n, dtype=bool)
        self.room_temp_c = self.comfort_c.copy()
        self._day = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
        self._times = np.zeros((n, 4))

    def local_hours(self, home: npt.NDArray[np.intp], t_ms: npt.NDArray[np.int64]) -> Floats:
        """Local time of day in hours [0, 24)."""
        return np.mod(t_ms / HOUR_MS + self.tz_shift_h[home], 24.0)

    def outside_temp(self, home: npt.NDArray[np.intp], t_ms: npt.NDArray[np.int64]) -> Floats:
        """Daily cycle (minimum near 05:00, maximum near 15:00) plus slow weather."""
        hours = self.local_hours(home, t_ms)
        days = t_ms / DAY_MS
        daily = -np.cos(_TWO_PI * (hours - 3.0) / 24.0)
        weather = 2.5 * np.sin(_TWO_PI * days / 3.7 + self.weather_phase[home, 0]) + 1.0 * np.sin(
            _TWO_PI * days / 0.83 + self.weather_phase[home, 1]
        )
        temperature: Floats = self.outside_mean_c[home] + self.outside_amp_c[home] * daily + weather
        return temperature

    def schedule(self, home: np.ndarray, t_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(people at home, awake) for each reading; leave and return times vary by day."""
        local_ms = t_ms + self.tz_shift_h[home] * HOUR_MS
        day = np.floor(local_ms / DAY_MS).astype(np.int64)
        hours = np.mod(local_ms / HOUR_MS, 24.0)
        stale = day != self._day[home]
        if stale.any():  # the day's times, drawn once per home and day
            homes, days = home[stale], day[stale]
            u = self.rng.uniform(self.uid[homes], days, _DAILY_STREAM, 4)
            self._day[homes] = days
            self._times[homes, 0] = 6.0 + 1.5 * u[:, 0]  # wake
            self._times[homes, 1] = 22.0 + 1.5 * u[:, 1]  # bed
            self._times[homes, 2] = self._times[homes, 0] + 1.0 + 0.5 * u[:, 2]  # leave for work
            self._times[homes, 3] = 16.5 + 2.5 * u[:, 3]  # back
        times = self._times[home]
        wake, bed, leave, back = times[:, 0], times[:, 1], times[:, 2], times[:, 3]
        weekday = np.mod(day + 3, 7) < 5  # 1970-01-01 was a Thursday
        away = self.works_away[home] & weekday & (hours >= leave) & (hours < back)
        awake = (hours >= wake) & (hours < bed)
        people = np.where(away, 0.0, self.people[home])
        return people, awake & ~away
