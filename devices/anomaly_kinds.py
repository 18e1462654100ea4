"""Anomaly kinds: what each does to a device's readings, where it applies, how long it lasts
(docs/internals.md, "Anomaly kinds")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from iotwatch.contract.detection import KIND_ALIASES, AnomalyKind, TransportFault
from iotwatch.contract.ground_truth import ANOMALY, TRANSPORT
from iotwatch.contract.metric_catalog import DEVICE_METRICS, PRIMARY_METRIC, metric_span
from iotwatch.contract.telemetry import DeviceType
from iotwatch.devices.home.contact import LEAK
from iotwatch.devices.home.thermostat import HVAC_STUCK
from iotwatch.devices.vehicle import CRASH, HARSH_BRAKING, OVERHEATING
from iotwatch.errors import UserError

__all__ = [
    "ANOMALY",
    "KINDS",
    "TRANSPORT",
    "Kind",
    "apply_measurement",
    "check_kinds",
    "draw_params",
    "kinds_for",
    "resolve_kind",
]


@dataclass(frozen=True)
class Kind:
    name: AnomalyKind | TransportFault
    category: Literal["anomaly", "transport"]  # ANOMALY or TRANSPORT
    duration_s: tuple[float, float]
    device_types: frozenset[str] | None = None  # None: every type
    mode: int = 0  # physical anomaly: the group's mode while active
    measurement: bool = False  # changes a metric's value
    drawn_by_default: bool = True  # False: the rate draws it only when named in the allowed kinds


_VEHICLE = frozenset({DeviceType.VEHICLE_EDR.value})
KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(AnomalyKind.SPIKE, ANOMALY, (0.0, 0.0), measurement=True),
        Kind(AnomalyKind.LEVEL_SHIFT, ANOMALY, (60.0, 600.0), measurement=True),
        Kind(AnomalyKind.DRIFT, ANOMALY, (300.0, 1800.0), measurement=True),
        Kind(AnomalyKind.FLATLINE, ANOMALY, (120.0, 900.0), measurement=True),
        Kind(AnomalyKind.NOISE_BURST, ANOMALY, (30.0, 300.0), measurement=True),
        Kind(AnomalyKind.OUT_OF_RANGE, ANOMALY, (0.0, 3.0), measurement=True),
        Kind(AnomalyKind.DROPOUT, ANOMALY, (30.0, 300.0)),
        Kind(AnomalyKind.STUCK_HVAC, ANOMALY, (1800.0, 7200.0), frozenset({DeviceType.THERMOSTAT.value}), HVAC_STUCK),
        Kind(AnomalyKind.WATER_LEAK, ANOMALY, (600.0, 3600.0), frozenset({DeviceType.LEAK_SENSOR.value}), LEAK),
        Kind(AnomalyKind.HARSH_BRAKING, ANOMALY, (6.0, 8.0), _VEHICLE, HARSH_BRAKING),
        Kind(AnomalyKind.CRASH, ANOMALY, (60.0, 120.0), _VEHICLE, CRASH),
        Kind(AnomalyKind.OVERHEATING, ANOMALY, (600.0, 1800.0), _VEHICLE, OVERHEATING, drawn_by_default=False),
        Kind(TransportFault.DUPLICATE, TRANSPORT, (0.0, 5.0)),
        Kind(TransportFault.OUT_OF_ORDER, TRANSPORT, (0.0, 0.0)),
        Kind(TransportFault.LATE, TRANSPORT, (0.0, 10.0)),
        Kind(TransportFault.CLOCK_SKEW, TRANSPORT, (60.0, 600.0)),
        Kind(TransportFault.MALFORMED, TRANSPORT, (0.0, 0.0)),
    )
}
ALIASES = KIND_ALIASES
MALFORMED_VARIANTS = (
    "truncated",
    "not_json",
    "invalid_utf8",
    "missing_field",
    "wrong_type",
    "nan",
    "unknown_field",
    "bad_version",
)


def resolve_kind(name: str) -> Kind:
    name = ALIASES.get(name, name)
    if name not in KINDS:
        raise UserError(f"unknown anomaly kind {name!r}; choose from {', '.join(sorted(KINDS))}")
    return KINDS[name]


def check_kinds(names: tuple[str, ...], category: str, device_types: set[str]) -> None:
    """Every name is a kind of ``category`` that one of ``device_types`` (the fleet) can
    produce; else a ValueError that says what is wrong and lists only this category's kinds
    (a kind that cannot happen would otherwise be drawn never, silently)."""
    option, noun = ("--anomalies", "anomaly") if category == ANOMALY else ("--faults", "transport fault")
    other_option, other_noun = (
        ("--faults", "a transport fault") if category == ANOMALY else ("--anomalies", "an anomaly")
    )
    valid = sorted(k.name for k in KINDS.values() if k.category == category)
    for name in names:
        kind = KINDS.get(ALIASES.get(name, name))
        if kind is None:
            raise UserError(f"{option}: unknown {noun} kind {name!r}; choose from {', '.join(valid)}")
        if kind.category != category:
            raise UserError(
                f"{option}: {name!r} is {other_noun} (give it to {other_option}); {noun} kinds: {', '.join(valid)}"
            )
        if kind.device_types is not None and not kind.device_types & device_types:
            raise UserError(
                f"{option}: {name!r} happens only to {', '.join(sorted(kind.device_types))} devices and "
                f"the fleet has none (it has {', '.join(sorted(device_types)) or 'no devices'})"
            )


def kinds_for(device_type: str, category: str, allowed: tuple[str, ...] | None) -> list[Kind]:
    """Kinds of ``category`` that apply to ``device_type`` (filtered by ``allowed``)."""
    names = None if allowed is None else {resolve_kind(n).name for n in allowed}
    return [
        k
        for k in KINDS.values()
        if k.category == category
        and (k.device_types is None or device_type in k.device_types)
        and (k.name in names if names is not None else k.drawn_by_default)
    ]


def draw_params(
    kind: Kind, device_type: str, metrics: tuple[str, ...], u: np.ndarray, given: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The kind's parameters: ``given`` ones (scenario) win, the rest drawn from ``u``
    (uniforms in [0, 1), at least 4)."""
    given = dict(given or {})
    params: dict[str, Any] = {}
    sign = 1.0 if u[1] < 0.5 else -1.0
    if kind.measurement:
        metric = given.pop("metric", None) or PRIMARY_METRIC.get(device_type, metrics[0])
        if metric not in metrics:
            raise UserError(f"{kind.name}: {device_type} has no metric {metric!r} (it has {', '.join(metrics)})")
        span = metric_span(device_type, metric)
        params["metric"] = metric
        if kind.name == "spike":
            params["delta"] = round(float(sign * span * (1.0 + 1.5 * u[2])), 4)
        elif kind.name == "level_shift":
            params["delta"] = round(float(sign * span * (0.5 + 1.0 * u[2])), 4)
        elif kind.name == "drift":
            params["delta"] = round(float(sign * span * (1.0 + 2.0 * u[2])), 4)  # reached at the end
        elif kind.name == "noise_burst":
            params["sigma"] = round(float(span * (0.2 + 0.4 * u[2])), 4)
        elif kind.name == "out_of_range":
            ranges = DEVICE_METRICS.get(device_type, {})
            if metric in ranges:
                _, low, high = ranges[metric]
                value = high + span * (0.2 + 1.8 * u[2]) if sign > 0 else low - span * (0.2 + 1.8 * u[2])
            else:
                value = sign * 1e9
            params["value"] = round(float(value), 4)
        magnitude = given.pop("magnitude", None)
        if magnitude is not None:
            key = "sigma" if kind.name == "noise_burst" else "value" if kind.name == "out_of_range" else "delta"
            params[key] = float(magnitude)
    elif kind.name == "duplicate":
        params["copies"] = 1 + int(u[2] * 2)
    elif kind.name == "out_of_order":
        params["depth"] = 1 + int(u[2] * 3)
    elif kind.name == "late":
        params["delay_s"] = round(float(30.0 + 270.0 * u[2]), 1)
    elif kind.name == "clock_skew":
        params["skew_s"] = round(float(sign * (2.0 + 598.0 * u[2])), 3)
    elif kind.name == "malformed":
        params["variant"] = MALFORMED_VARIANTS[int(u[2] * len(MALFORMED_VARIANTS))]
    for key, value in given.items():
        params[key] = value
    return params


def apply_measurement(
    kind: str,
    params: dict[str, Any],
    value: float,
    elapsed_ms: float,
    duration_ms: float,
    state: dict[str, Any],
    noise: float,
) -> float:
    """The anomalous value of one reading (before clipping to the physical range)."""
    if kind in ("spike", "level_shift"):
        return value + float(params["delta"])
    if kind == "drift":
        return value + float(params["delta"]) * (elapsed_ms / duration_ms if duration_ms > 0 else 1.0)
    if kind == "flatline":
        return float(state.setdefault("value", value))
    if kind == "noise_burst":
        return value + float(params["sigma"]) * noise
    if kind == "out_of_range":
        return float(params["value"])
    return value
