"""The alert rules: which conditions each reading is judged on, and how each fires.

Every rule turns one reading into an :class:`~iotwatch.streaming.alerting.Observation` (a score in
[0, 1] plus what to say about it); :mod:`iotwatch.streaming.alerting` turns observations into a
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
from typing import Protocol

import numpy as np

from iotwatch.contract.alerts import Severity
from iotwatch.contract.detection import Rule
from iotwatch.contract.metric_catalog import danger_limits
from iotwatch.models.crash import is_crash
from iotwatch.settings import StreamSettings
from iotwatch.streaming.alerting import Observation, RuleSpec
from iotwatch.streaming.cleaning import physical_range

#: The rules of the catalogue's danger limits, and their severities.
DANGER_RULES: dict[str, Severity] = {limit.rule: Severity(limit.severity) for _, _, limit in danger_limits()}
if set(DANGER_RULES) != {Rule.COOLANT_OVERHEATING, Rule.BATTERY_LOW, Rule.HUMIDITY_HIGH}:
    raise RuntimeError(f"the metric catalogue's danger rules {sorted(DANGER_RULES)} are not the engine's")


def rule_specs(settings: StreamSettings, detector: str) -> dict[str, RuleSpec]:
    """The rules, their anti-flap parameters and runbook links, from the stream settings."""
    specs: dict[str, RuleSpec] = {
        Rule.ANOMALY_SCORE: RuleSpec(
            Rule.ANOMALY_SCORE,
            Severity.WARNING,
            settings.alert_fire_score,
            settings.alert_clear_score,
            settings.alert_hold_readings,
            settings.alert_clear_readings,
            detector,
        ),
        Rule.OUT_OF_RANGE: RuleSpec(Rule.OUT_OF_RANGE, Severity.MAJOR, 0.5, 0.5, 1, settings.alert_clear_readings),
        Rule.CRASH: RuleSpec(Rule.CRASH, Severity.CRITICAL, 0.5, 0.5, 1, settings.alert_clear_readings),
        Rule.HARSH_BRAKING: RuleSpec(Rule.HARSH_BRAKING, Severity.WARNING, 0.5, 0.5, 1, settings.alert_clear_readings),
        Rule.WATER_LEAK: RuleSpec(Rule.WATER_LEAK, Severity.CRITICAL, 0.5, 0.5, 1, settings.alert_clear_readings),
        Rule.STUCK_HVAC: RuleSpec(
            Rule.STUCK_HVAC,
            Severity.MAJOR,
            0.5,
            0.5,
            settings.stuck_hvac_readings,
            settings.alert_clear_readings,
            hold_ms=int(settings.stuck_hvac_s * 1000),
        ),
        Rule.DEVICE_SILENT: RuleSpec(Rule.DEVICE_SILENT, Severity.MAJOR, 0.5, 0.5, 1, 1),
        Rule.FLEET_ANOMALY: RuleSpec(
            Rule.FLEET_ANOMALY,
            Severity.WARNING,
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


class BatchReadings(Protocol):
    """What the rules read: per-reading columns of one micro-batch."""

    @property
    def device_type(self) -> np.ndarray: ...

    @property
    def event(self) -> np.ndarray: ...

    @property
    def out_of_range(self) -> np.ndarray:
        """Whether any metric of the reading is outside its physical range."""

    def metric(self, name: str) -> np.ndarray:
        """The metric's value per reading, NaN where the reading lacks it."""


def rule_scores(readings: BatchReadings, settings: StreamSettings) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each rule: (applies, score) per reading. A rule applies to the readings of its
    device types (or carrying its event) that have the metrics it needs; its score is in
    [0, 1]. This is the only place a rule's condition is written."""
    n = len(readings.device_type)
    everyone = np.ones(n, dtype=bool)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {Rule.OUT_OF_RANGE: (everyone, readings.out_of_range.astype(float))}
    event = readings.event
    accel = readings.metric("accel_x_g")
    crash_event = event == "crash"
    vehicle = (readings.device_type == "vehicle_edr") | crash_event
    if vehicle.any():
        crash_g, harsh_g = settings.crash_decel_g, settings.harsh_braking_g
        crashed = crash_event | is_crash(accel, crash_g)
        with np.errstate(invalid="ignore"):
            harsh = (harsh_g <= -accel) & ~crashed
        out[Rule.CRASH] = (vehicle, crashed.astype(float))
        out[Rule.HARSH_BRAKING] = (vehicle, harsh.astype(float))
    leak_event = event == "leak"
    leak = (readings.device_type == "leak_sensor") | leak_event
    if leak.any():
        with np.errstate(invalid="ignore"):
            wet = leak_event | (readings.metric("water_detected") >= 0.5)
        out[Rule.WATER_LEAK] = (leak, wet.astype(float))
    thermostat = readings.device_type == "thermostat"
    if thermostat.any():
        hvac = _hvac(readings, settings)
        applies = thermostat & hvac.known
        out[Rule.STUCK_HVAC] = (applies, (hvac.stuck & applies).astype(float))
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


@dataclass(frozen=True)
class _Hvac:
    """A thermostat's HVAC against its setpoint, per reading."""

    known: np.ndarray  # the reading has temperature, setpoint and HVAC state
    heating: np.ndarray  # outside colder than the setpoint: the HVAC heats
    overshoot: np.ndarray  # past the setpoint in the direction the HVAC pushes
    stuck: np.ndarray  # running, and past the setpoint or far from it
    gap: np.ndarray  # degrees between the temperature and the setpoint


def _hvac(readings: BatchReadings, settings: StreamSettings) -> _Hvac:
    """HVAC running but not doing its job: past the setpoint in the direction it pushes
    (heating above it, cooling below it: a thermostat's hysteresis switches off within a
    fraction of a degree), or far from the setpoint either way. Heating or cooling is what
    the thermostat reports (``hvac_cooling``); from a thermostat that does not, it is told by
    the outside temperature: below the setpoint, the HVAC heats."""
    temperature, setpoint, hvac = (readings.metric(m) for m in ("temperature_c", "setpoint_c", "hvac_on"))
    outside, mode = readings.metric("outside_temperature_c"), readings.metric("hvac_cooling")
    gap = temperature - setpoint
    with np.errstate(invalid="ignore"):
        reported = ~np.isnan(mode)
        heating = np.where(reported, mode < 0.5, outside < setpoint)
        cooling = np.where(reported, mode >= 0.5, outside > setpoint)
        overshoot = (heating & (gap > settings.stuck_hvac_overshoot_c)) | (
            cooling & (gap < -settings.stuck_hvac_overshoot_c)
        )
        stuck = (hvac >= 0.5) & (overshoot | (np.abs(gap) > settings.stuck_hvac_c))
    known = ~np.isnan(temperature) & ~np.isnan(setpoint) & ~np.isnan(hvac)
    return _Hvac(known, heating, overshoot, stuck, np.abs(gap))


def stuck_hvac_hold_ms(readings: BatchReadings, settings: StreamSettings) -> np.ndarray:
    """How long (event time) each reading's stuck-HVAC condition must last before it raises:
    ``stuck_hvac_s`` for an HVAC pushing past its setpoint (never the way to a setpoint); for
    one running far from it, also the time a working HVAC needs to close that gap at
    ``stuck_hvac_settle_c_per_h``. A setpoint moved by an operator (the twin's desired state)
    or the household's schedule leaves the room far from it while the HVAC works its way
    there: that settling is not a fault, and its length grows with the gap."""
    hvac = _hvac(readings, settings)
    settle_ms = np.nan_to_num(hvac.gap) / settings.stuck_hvac_settle_c_per_h * 3_600_000
    base = settings.stuck_hvac_s * 1000
    return np.where(hvac.overshoot, base, np.maximum(base, settle_ms)).astype(np.int64)


# --- one reading: the observations alert records carry ---------------------------------------


@dataclass(frozen=True)
class ReadingView:
    """What rules look at: the normalised metrics, event and quality flags of one reading."""

    device_type: str
    metrics: Mapping[str, float]
    event: str | None
    out_of_range: tuple[str, ...]


class _OneReading:
    """A :class:`ReadingView` as a micro-batch of one reading, for :func:`rule_scores`."""

    def __init__(self, reading: ReadingView) -> None:
        self.reading = reading
        self.device_type = np.array([reading.device_type], dtype=object)
        self.event = np.array([reading.event], dtype=object)
        self.out_of_range = np.array([bool(reading.out_of_range)])

    def metric(self, name: str) -> np.ndarray:
        value = self.reading.metrics.get(name)
        return np.array([np.nan if value is None else value], dtype=float)


def evaluate(reading: ReadingView, settings: StreamSettings) -> dict[str, Observation]:
    """Observations of every rule that applies to this reading: :func:`rule_scores` of the
    reading, each with what to say about it."""
    one = _OneReading(reading)
    return {
        rule: _describe(rule, reading, float(score[0]), one, settings)
        for rule, (applies, score) in rule_scores(one, settings).items()
        if applies[0]
    }


def _describe(rule: str, reading: ReadingView, score: float, one: _OneReading, settings: StreamSettings) -> Observation:
    """The observation of ``rule`` on ``reading``, given the score the rule gave it."""
    metrics = reading.metrics
    if rule == Rule.OUT_OF_RANGE:
        return _out_of_range(reading)
    if rule in (Rule.CRASH, Rule.HARSH_BRAKING):
        accel = metrics.get("accel_x_g")
        if rule == Rule.HARSH_BRAKING:
            harsh_g = settings.harsh_braking_g
            if score >= 1.0 and accel is not None:
                detail = f"harsh braking: deceleration {-accel:.2f} g beyond {harsh_g:g} g"
                return Observation(1.0, "accel_x_g", accel, -harsh_g, detail)
            return Observation(0.0, "accel_x_g", accel, -harsh_g, "no harsh braking")
        crash_g = settings.crash_decel_g
        if reading.event == "crash":
            detail = f"crash event reported (longitudinal {accel:g} g)" if accel is not None else "crash event reported"
        elif score >= 1.0 and accel is not None:
            detail = f"deceleration {-accel:.1f} g beyond the crash threshold {crash_g:g} g"
        else:
            detail = "no crash deceleration"
        return Observation(score, "accel_x_g", accel, -crash_g, detail)
    if rule == Rule.WATER_LEAK:
        return Observation(
            score, "water_detected", metrics.get("water_detected"), 0.5, "water detected" if score else "dry"
        )
    if rule == Rule.STUCK_HVAC:
        temperature, setpoint = metrics["temperature_c"], metrics["setpoint_c"]
        gap = temperature - setpoint
        if not score:
            return Observation(0.0, "temperature_c", temperature, setpoint, f"temperature {gap:+.1f} C from setpoint")
        hvac = _hvac(one, settings)
        how = "heating" if hvac.heating[0] else "cooling"
        why = f"{how} past the setpoint" if hvac.overshoot[0] else "far from setpoint"
        return Observation(
            1.0,
            "temperature_c",
            temperature,
            setpoint,
            f"HVAC running but temperature {temperature:.1f} C is {gap:+.1f} C from setpoint {setpoint:.1f} C ({why})",
        )
    for device_type, metric, limit in danger_limits():
        if limit.rule == rule and device_type == reading.device_type:
            value = metrics[metric]
            return Observation(score, metric, value, limit.warning, limit.describe(metric, value))
    raise ValueError(f"no observation of rule {rule!r} for a {reading.device_type} reading")


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
