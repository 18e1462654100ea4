"""The metric catalogue, part of the message contract: metric units and physical ranges
per device type, read by the simulators that publish them and the job that checks them.

``DEVICE_METRICS[device_type][metric] = (unit, min, max)`` is the plausible physical
range of each metric the simulators publish; the streaming job's range checks and the
``out_of_range`` anomaly both use it. Metric names carry their unit (``temperature_c``,
``power_w``, ``accel_x_g``) so a reading is self-describing.

>>> DEVICE_METRICS["thermostat"]["temperature_c"]
('degC', -10.0, 45.0)
>>> metric_range("vehicle_edr", "speed_kmh")
(0.0, 250.0)

``DANGER_LIMITS[device_type][metric]`` is where a metric becomes dangerous, well inside its
physical range: a warning and a critical limit and the streaming job's rule that alerts on
them, so a drift into danger alerts when it gets dangerous, not when the sensor saturates.

>>> DANGER_LIMITS["vehicle_edr"]["coolant_temp_c"].describe("coolant_temp_c", 107.5)
'coolant_temp_c=107.5 above its warning limit 105 (critical 115): coolant overheating'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from iotwatch.contract.telemetry import DeviceType

__all__ = [
    "DANGER_LIMITS",
    "DEVICE_METRICS",
    "DEFAULT_INTERVAL_S",
    "DERIVED_METRICS",
    "KNOWN_METRICS",
    "UNIT_ALIASES",
    "PRIMARY_METRIC",
    "METRIC_DECIMALS",
    "NOT_SCORED",
    "DangerLimit",
    "danger_limits",
    "metric_range",
    "metric_span",
]

MetricRange = tuple[str, float, float]

_METRICS: dict[str, dict[str, MetricRange]] = {
    DeviceType.THERMOSTAT: {
        "temperature_c": ("degC", -10.0, 45.0),
        "humidity_pct": ("%RH", 0.0, 100.0),
        "setpoint_c": ("degC", 5.0, 35.0),
        "hvac_on": ("bool", 0.0, 1.0),
        # what the HVAC does when on (1 cools, 0 heats), as thermostats report their mode
        "hvac_cooling": ("bool", 0.0, 1.0),
        "outside_temperature_c": ("degC", -40.0, 50.0),
    },
    DeviceType.SMART_METER: {
        "power_w": ("W", 0.0, 15000.0),
        "voltage_v": ("V", 200.0, 260.0),
        "current_a": ("A", 0.0, 65.0),
        "energy_kwh": ("kWh", 0.0, 1.0e7),
    },
    DeviceType.AIR_QUALITY: {
        "co2_ppm": ("ppm", 350.0, 5000.0),
        "pm25_ugm3": ("ug/m3", 0.0, 500.0),
        "temperature_c": ("degC", -10.0, 45.0),
    },
    DeviceType.DOOR_SENSOR: {
        "open": ("bool", 0.0, 1.0),
        "battery_pct": ("%", 0.0, 100.0),
        "temperature_c": ("degC", -30.0, 50.0),
    },
    DeviceType.LEAK_SENSOR: {
        "water_detected": ("bool", 0.0, 1.0),
        "battery_pct": ("%", 0.0, 100.0),
        "temperature_c": ("degC", -10.0, 50.0),
    },
    DeviceType.VEHICLE_EDR: {
        "speed_kmh": ("km/h", 0.0, 250.0),
        "engine_rpm": ("rpm", 0.0, 8000.0),
        "throttle_pct": ("%", 0.0, 100.0),
        "brake_pct": ("%", 0.0, 100.0),
        "steering_angle_deg": ("deg", -540.0, 540.0),
        "accel_x_g": ("g", -50.0, 50.0),  # longitudinal, positive forward
        "accel_y_g": ("g", -50.0, 50.0),  # lateral, positive left
        "accel_z_g": ("g", -50.0, 50.0),  # vertical, about +1 at rest
        "lat_deg": ("deg", -90.0, 90.0),
        "lon_deg": ("deg", -180.0, 180.0),
        "heading_deg": ("deg", 0.0, 360.0),
        "coolant_temp_c": ("degC", -40.0, 130.0),
        "fuel_level_pct": ("%", 0.0, 100.0),
    },
}

#: device_type -> metric -> (unit, min, max). Read-only.
DEVICE_METRICS: Mapping[str, Mapping[str, MetricRange]] = MappingProxyType(
    {str(t): MappingProxyType(m) for t, m in _METRICS.items()}
)


#: Metrics reported in another unit -> (canonical metric, conversion).
UNIT_ALIASES: Mapping[str, tuple[str, Callable[[float], float]]] = {
    "temperature_f": ("temperature_c", lambda f: (f - 32.0) * 5.0 / 9.0),
    "temperature_k": ("temperature_c", lambda k: k - 273.15),
    "outside_temperature_f": ("outside_temperature_c", lambda f: (f - 32.0) * 5.0 / 9.0),
    "setpoint_f": ("setpoint_c", lambda f: (f - 32.0) * 5.0 / 9.0),
    "coolant_temp_f": ("coolant_temp_c", lambda f: (f - 32.0) * 5.0 / 9.0),
    "speed_mph": ("speed_kmh", lambda mph: mph * 1.609344),
    "speed_ms": ("speed_kmh", lambda ms: ms * 3.6),
    "power_kw": ("power_w", lambda kw: kw * 1000.0),
    "energy_wh": ("energy_kwh", lambda wh: wh / 1000.0),
    "accel_x_ms2": ("accel_x_g", lambda a: a / 9.80665),
    "accel_y_ms2": ("accel_y_g", lambda a: a / 9.80665),
    "accel_z_ms2": ("accel_z_g", lambda a: a / 9.80665),
}


#: device_type -> the metric names a reading of that type may carry: its catalogue metrics and
#: the unit aliases of them. A reading of a catalogued type with any other metric is refused by
#: the contract as ``unknown_metric`` (a device type not in the catalogue is not judged).
KNOWN_METRICS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        device_type: frozenset(metrics)
        | frozenset(alias for alias, (canonical, _convert) in UNIT_ALIASES.items() if canonical in metrics)
        for device_type, metrics in DEVICE_METRICS.items()
    }
)


#: Metrics the streaming job computes from others (``iotwatch.streaming.cleaning.clean_entries``).
DERIVED_METRICS = ("power_factor",)

#: Metrics whose values are states, positions, counters or driver inputs: range-checked,
#: archived and aggregated, but not given to the statistical detectors (rules look at them
#: instead). A fuel gauge is one too: it falls smoothly and jumps at every refuel, so a
#: per-metric detector raised an alert at each fill-up (about one per vehicle-day).
NOT_SCORED = frozenset(
    {
        "hvac_on",
        "hvac_cooling",
        "open",
        "water_detected",
        "lat_deg",
        "lon_deg",
        "heading_deg",
        "energy_kwh",
        "setpoint_c",
        "steering_angle_deg",
        "throttle_pct",
        "brake_pct",
        "speed_kmh",
        "engine_rpm",
        "accel_x_g",
        "accel_y_g",
        "accel_z_g",
        "fuel_level_pct",
    }
)


@dataclass(frozen=True)
class DangerLimit:
    """Where a metric is dangerous: beyond ``warning`` (above it, or below it when ``above``
    is false), worse beyond ``critical``; ``rule`` names the alert, ``severity`` its
    severity, ``what`` the danger in words."""

    rule: str
    above: bool
    warning: float
    critical: float
    severity: str
    what: str

    def levels(self, values: np.ndarray) -> np.ndarray:
        """Per value: 0 inside the limits (or NaN), 0.5 beyond the warning limit, 1 beyond
        the critical one."""
        sign = 1.0 if self.above else -1.0
        with np.errstate(invalid="ignore"):
            critical = sign * (values - self.critical) >= 0.0
            beyond = sign * (values - self.warning) >= 0.0
        return np.where(critical, 1.0, np.where(beyond, 0.5, 0.0))

    def level(self, value: float) -> float:
        """:meth:`levels` of one value."""
        return float(self.levels(np.asarray(value, dtype=float)))

    def describe(self, metric: str, value: float) -> str:
        """What a reading's value of ``metric`` says against the limits."""
        side = "above" if self.above else "below"
        level = self.level(value)
        name = f"{metric}={value:g}"
        if level == 0.0:
            return f"{name} within its limits (warning {side} {self.warning:g}, critical {self.critical:g})"
        which = "critical" if level == 1.0 else "warning"
        other = f" (critical {self.critical:g})" if level < 1.0 else ""
        return (
            f"{name} {side} its {which} limit {self.critical if level == 1.0 else self.warning:g}{other}: {self.what}"
        )


_LIMITS: dict[str, dict[str, DangerLimit]] = {
    # a warm engine runs at 88-92 C (its thermostat opens at about 88); past 105 the cooling is
    # failing, past 115 the engine is at risk (boiling even under a pressurised cap)
    DeviceType.VEHICLE_EDR: {
        "coolant_temp_c": DangerLimit("coolant_overheating", True, 105.0, 115.0, "critical", "coolant overheating"),
    },
    # a coin cell this low gives out within weeks, and the sensor (a leak's alarm) with it
    DeviceType.DOOR_SENSOR: {"battery_pct": DangerLimit("battery_low", False, 15.0, 5.0, "minor", "battery low")},
    DeviceType.LEAK_SENSOR: {"battery_pct": DangerLimit("battery_low", False, 15.0, 5.0, "minor", "battery low")},
    # indoor air this humid for long grows mould (kept below 60-70 %RH by building guidance)
    DeviceType.THERMOSTAT: {"humidity_pct": DangerLimit("humidity_high", True, 70.0, 80.0, "warning", "humid air")},
}

#: device_type -> metric -> :class:`DangerLimit`, for the metrics that have one. Read-only.
DANGER_LIMITS: Mapping[str, Mapping[str, DangerLimit]] = MappingProxyType(
    {str(t): MappingProxyType(m) for t, m in _LIMITS.items()}
)


def danger_limits() -> list[tuple[str, str, DangerLimit]]:
    """Every (device_type, metric, limit), in a fixed order."""
    return [(t, m, limit) for t, metrics in DANGER_LIMITS.items() for m, limit in metrics.items()]


#: Decimal places each metric is published with (payload size and realism).
METRIC_DECIMALS: Mapping[str, int] = MappingProxyType(
    {
        "temperature_c": 2,
        "humidity_pct": 1,
        "setpoint_c": 1,
        "hvac_on": 0,
        "hvac_cooling": 0,
        "outside_temperature_c": 2,
        "power_w": 1,
        "voltage_v": 1,
        "current_a": 3,
        "energy_kwh": 4,
        "co2_ppm": 1,
        "pm25_ugm3": 1,
        "open": 0,
        "battery_pct": 1,
        "water_detected": 0,
        "speed_kmh": 2,
        "engine_rpm": 0,
        "throttle_pct": 1,
        "brake_pct": 1,
        "steering_angle_deg": 1,
        "accel_x_g": 3,
        "accel_y_g": 3,
        "accel_z_g": 3,
        "lat_deg": 6,
        "lon_deg": 6,
        "heading_deg": 1,
        "coolant_temp_c": 1,
        "fuel_level_pct": 2,
        "value": 6,
    }
)

#: The metric measurement anomalies (spike, drift, ...) change unless told otherwise.
PRIMARY_METRIC: Mapping[str, str] = MappingProxyType(
    {
        DeviceType.THERMOSTAT: "temperature_c",
        DeviceType.SMART_METER: "power_w",
        DeviceType.AIR_QUALITY: "co2_ppm",
        DeviceType.DOOR_SENSOR: "temperature_c",
        DeviceType.LEAK_SENSOR: "temperature_c",
        DeviceType.VEHICLE_EDR: "coolant_temp_c",
    }
)

#: Default reporting interval per device type, seconds (``--rate``/``--vehicle-hz`` change it).
DEFAULT_INTERVAL_S: Mapping[str, float] = MappingProxyType(
    {
        DeviceType.THERMOSTAT: 1.0,
        DeviceType.SMART_METER: 1.0,
        DeviceType.AIR_QUALITY: 1.0,
        DeviceType.DOOR_SENSOR: 1.0,
        DeviceType.LEAK_SENSOR: 1.0,
        DeviceType.VEHICLE_EDR: 0.1,
    }
)


def metric_range(device_type: str, metric: str) -> tuple[float, float]:
    """(min, max) of a metric; KeyError for an unknown type or metric."""
    _, low, high = DEVICE_METRICS[device_type][metric]
    return low, high


def metric_span(device_type: str, metric: str) -> float:
    """A typical scale for a metric's anomalies: a tenth of its physical range, bounded
    for metrics whose range is huge (cumulative energy) or tiny (booleans)."""
    metrics = DEVICE_METRICS.get(device_type, {})
    if metric not in metrics:
        return 1.0
    _, low, high = metrics[metric]
    return min(max((high - low) * 0.1, 0.5), 1000.0)
