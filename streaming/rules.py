"""The alert rules: which conditions each reading is judged on, and how each fires.

Every rule turns one reading into an :class:`~streaming.alerting.Observation` (a score in
[0, 1] plus what to say about it); :mod:`streaming.alerting` turns observations into a
raised/cleared lifecycle. Rules that do not apply to a device type return nothing.

The danger rules (:data:`DANGER_RULES`: coolant overheating, low battery, humid air) judge a
metric against its physical danger limits in the metric catalogue
(:data:`iotwatch.contract.metric_catalog.DANGER_LIMITS`): 0.5 past the warning limit, 1 past the critical one,
so a drift into danger alerts when it crosses the warning limit, whatever the detector
learned on the way there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Protocol

import numpy as np

from iotwatch.contract.detection import Rule
from iotwatch.contract.metric_catalog import danger_limits
from iotwatch.settings import StreamSettings
from models.crash import CrashDeceleration
from streaming.alerting import Observation, RuleSpec
from streaming.cleaning import physical_range

ANOMALY = Rule.ANOMALY_SCORE.value
OUT_OF_RANGE = Rule.OUT_OF_RANGE.value
CRASH = Rule.CRASH.value
HARSH_BRAKING = Rule.HARSH_BRAKING.value
LEAK = Rule.WATER_LEAK.value
STUCK_HVAC = Rule.STUCK_HVAC.value
SILENT = Rule.DEVICE_SILENT.value
FLEET = Rule.FLEET_ANOMALY.value
COOLANT = Rule.COOLANT_OVERHEATING.value
BATTERY = Rule.BATTERY_LOW.value
HUMIDITY = Rule.HUMIDITY_HIGH.value
#: The rules of the catalogue's danger limits, and their severities.
DANGER_RULES: dict[str, str] = {limit.rule: limit.severity for _, _, limit in danger_limits()}
if set(DANGER_RULES) != {COOLANT, BATTERY, HUMIDITY}:
    raise RuntimeError(f"the metric catalogue's danger rules {sorted(DANGER_RULES)} are not the engine's")


def rule_specs(settings: StreamSettings, detector: str) -> dict[str, RuleSpec]:
    """The rules, their anti-flap parameters and runbook links, from the stream settings."""
    specs = {
        ANOMALY: RuleSpec(
            ANOMALY,
            "warning",
            settings.alert_fire_score,
            settings.alert_clear_score,
            settings.alert_hold_readings,
            settings.alert_clear_readings,
            detector,
        ),
        OUT_OF_RANGE: RuleSpec(OUT_OF_RANGE, "major", 0.5, 0.5, 1, settings.alert_clear_readings),
        CRASH: RuleSpec(CRASH, "critical", 0.5, 0.5, 1, settings.alert_clear_readings),
        HARSH_BRAKING: RuleSpec(HARSH_BRAKING, "warning", 0.5, 0.5, 1, settings.alert_clear_readings),
        LEAK: RuleSpec(LEAK, "critical", 0.5, 0.5, 1, settings.alert_clear_readings),
        STUCK_HVAC: RuleSpec(
            STUCK_HVAC,
            "major",
            0.5,
            0.5,
            settings.stuck_hvac_readings,
            settings.alert_clear_readings,
            hold_ms=int(settings.stuck_hvac_s * 1000),
        ),
        SILENT: RuleSpec(SILENT, "major", 0.5, 0.5, 1, 1),
        FLEET: RuleSpec(
            FLEET,
            "warning",
            settings.fleet_fire_score,
            settings.fleet_fire_score - 0.1,
            settings.alert_hold_readings,
            settings.alert_clear_readings,
            settings.fleet_detector or "fleet",
        ),
    }
    for rule, severity in DANGER_RULES.items():
        specs[rule] = RuleSpec(rule, severity, 0.5, 0.5, 1, settings.alert_clear_readings)
    return {name: replace(spec, runbook_url=settings.runbook_url(name)) for name, spec in specs.items()}


@dataclass(frozen=True)
class ReadingView:
    """What rules look at: the normalised metrics, event and quality flags of one reading."""

    device_type: str
    metrics: Mapping[str, float]
    event: str | None
    out_of_range: tuple[str, ...]


def evaluate(reading: ReadingView, settings: StreamSettings) -> dict[str, Observation]:
    """Observations of every rule that applies to this reading's device type."""
    observations: dict[str, Observation] = {}
    observations[OUT_OF_RANGE] = _out_of_range(reading)
    if reading.device_type == "vehicle_edr" or reading.event == "crash":
        observations[CRASH] = _crash(reading, settings.crash_decel_g)
        observations[HARSH_BRAKING] = _harsh_braking(reading, settings.harsh_braking_g, settings.crash_decel_g)
    if reading.device_type == "leak_sensor" or reading.event == "leak":
        observations[LEAK] = _leak(reading)
    if reading.device_type == "thermostat":
        stuck = _stuck_hvac(reading, settings.stuck_hvac_c, settings.stuck_hvac_overshoot_c)
        if stuck is not None:
            observations[STUCK_HVAC] = stuck
    for device_type, metric, limit in danger_limits():
        value = reading.metrics.get(metric)
        if device_type == reading.device_type and value is not None and value == value:  # NaN: no reading
            observations[limit.rule] = Observation(
                limit.level(value), metric, value, limit.warning, limit.describe(metric, value)
            )
    return observations


def _out_of_range(reading: ReadingView) -> Observation:
    if not reading.out_of_range:
        return Observation(0.0, None, None, None, "all metrics within physical range")
    metric = reading.out_of_range[0]
    value = reading.metrics[metric]
    bounds = physical_range(reading.device_type, metric) or (float("nan"), float("nan"))
    limit = bounds[0] if value < bounds[0] else bounds[1]
    return Observation(
        1.0,
        metric,
        value,
        limit,
        f"{metric}={value:g} outside its physical range [{bounds[0]:g}, {bounds[1]:g}]",
        tuple((m, reading.metrics[m], 1.0) for m in reading.out_of_range),
    )


@lru_cache(maxsize=8)
def _crash_detector(decel_g: float) -> CrashDeceleration:
    return CrashDeceleration(metric="accel_x_g", threshold_g=decel_g)


def _crash(reading: ReadingView, decel_g: float) -> Observation:
    accel = reading.metrics.get("accel_x_g")
    if reading.event == "crash":
        detail = f"crash event reported (longitudinal {accel:g} g)" if accel is not None else "crash event reported"
        return Observation(1.0, "accel_x_g", accel, -decel_g, detail)
    if _crash_detector(decel_g).score_one(reading.metrics, 0) >= 1.0:
        return Observation(
            1.0, "accel_x_g", accel, -decel_g, f"deceleration {-accel:.1f} g beyond the crash threshold {decel_g:g} g"
        )
    return Observation(0.0, "accel_x_g", accel, -decel_g, "no crash deceleration")


def _harsh_braking(reading: ReadingView, harsh_g: float, crash_g: float) -> Observation:
    """Braking hard enough for a driver-behaviour warning, short of a crash (which its own rule reports)."""
    accel = reading.metrics.get("accel_x_g")
    if accel is not None and harsh_g <= -accel < crash_g and reading.event != "crash":
        return Observation(
            1.0, "accel_x_g", accel, -harsh_g, f"harsh braking: deceleration {-accel:.2f} g beyond {harsh_g:g} g"
        )
    return Observation(0.0, "accel_x_g", accel, -harsh_g, "no harsh braking")


def _leak(reading: ReadingView) -> Observation:
    wet = reading.metrics.get("water_detected")
    if reading.event == "leak" or (wet is not None and wet >= 0.5):
        return Observation(1.0, "water_detected", wet, 0.5, "water detected")
    return Observation(0.0, "water_detected", wet, 0.5, "dry")


def _stuck_hvac(reading: ReadingView, max_gap_c: float, overshoot_c: float) -> Observation | None:
    """HVAC running but not doing its job: past the setpoint in the direction it pushes
    (heating above it, cooling below it: a thermostat's hysteresis switches off within a
    fraction of a degree), or far from the setpoint either way. Heating or cooling is
    told by the outside temperature: below the setpoint, the HVAC heats."""
    metrics = reading.metrics
    if not {"temperature_c", "setpoint_c", "hvac_on"} <= metrics.keys():
        return None
    temperature, setpoint = metrics["temperature_c"], metrics["setpoint_c"]
    gap = temperature - setpoint
    running = metrics["hvac_on"] >= 0.5
    outside = metrics.get("outside_temperature_c")
    heating = outside is not None and outside < setpoint
    cooling = outside is not None and outside > setpoint
    overshoot = (heating and gap > overshoot_c) or (cooling and gap < -overshoot_c)
    if running and (overshoot or abs(gap) > max_gap_c):
        why = f"{'heating' if heating else 'cooling'} past the setpoint" if overshoot else "far from setpoint"
        return Observation(
            1.0,
            "temperature_c",
            temperature,
            setpoint,
            f"HVAC running but temperature {temperature:.1f} C is {gap:+.1f} C from setpoint {setpoint:.1f} C ({why})",
        )
    return Observation(0.0, "temperature_c", temperature, setpoint, f"temperature {gap:+.1f} C from setpoint")


# --- the same rules over a whole micro-batch (scores only; the hot path) ----------------------


class BatchReadings(Protocol):
    """What the vectorised rules read: per-reading columns of one micro-batch."""

    device_type: np.ndarray
    event: np.ndarray
    out_of_range: np.ndarray  # any metric of the reading outside its physical range

    def metric(self, name: str) -> np.ndarray:
        """The metric's value per reading, NaN where the reading lacks it."""


def rule_scores(readings: BatchReadings, settings: StreamSettings) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each rule: (applies, score) per reading, equal to :func:`evaluate`'s observations
    (a rule that does not apply to a reading gives it no observation at all)."""
    n = len(readings.device_type)
    everyone = np.ones(n, dtype=bool)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {OUT_OF_RANGE: (everyone, readings.out_of_range.astype(float))}
    event = readings.event
    accel = readings.metric("accel_x_g")
    crash_event = event == "crash"
    vehicle = (readings.device_type == "vehicle_edr") | crash_event
    if vehicle.any():
        crash_g, harsh_g = settings.crash_decel_g, settings.harsh_braking_g
        with np.errstate(invalid="ignore"):
            crashed = crash_event | (-accel >= crash_g)
            harsh = (harsh_g <= -accel) & (-accel < crash_g) & ~crash_event
        out[CRASH] = (vehicle, crashed.astype(float))
        out[HARSH_BRAKING] = (vehicle, harsh.astype(float))
    leak_event = event == "leak"
    leak = (readings.device_type == "leak_sensor") | leak_event
    if leak.any():
        with np.errstate(invalid="ignore"):
            wet = leak_event | (readings.metric("water_detected") >= 0.5)
        out[LEAK] = (leak, wet.astype(float))
    thermostat = readings.device_type == "thermostat"
    if thermostat.any():
        out[STUCK_HVAC] = _stuck_hvac_scores(readings, thermostat, settings)
    for device_type, metric, limit in danger_limits():
        of_type = readings.device_type == device_type
        if not of_type.any():
            continue
        value = readings.metric(metric)
        applies = of_type & ~np.isnan(value)
        score = limit.levels(value) * applies
        if limit.rule in out:  # a rule of several device types (a battery on door and leak sensors)
            applies, score = applies | out[limit.rule][0], np.maximum(score, out[limit.rule][1])
        out[limit.rule] = (applies, score)
    return out


def _stuck_hvac_scores(
    readings: BatchReadings, thermostat: np.ndarray, settings: StreamSettings
) -> tuple[np.ndarray, np.ndarray]:
    temperature, setpoint, hvac = (readings.metric(m) for m in ("temperature_c", "setpoint_c", "hvac_on"))
    outside = readings.metric("outside_temperature_c")
    applies = thermostat & ~np.isnan(temperature) & ~np.isnan(setpoint) & ~np.isnan(hvac)
    gap = temperature - setpoint
    with np.errstate(invalid="ignore"):
        heating, cooling = outside < setpoint, outside > setpoint
        overshoot = (heating & (gap > settings.stuck_hvac_overshoot_c)) | (
            cooling & (gap < -settings.stuck_hvac_overshoot_c)
        )
        stuck = (hvac >= 0.5) & (overshoot | (np.abs(gap) > settings.stuck_hvac_c))
    return applies, (stuck & applies).astype(float)
