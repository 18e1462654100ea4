"""Who is in the fleet: homes with a seeded mix of devices, vehicles, replayed streams
(docs/internals.md, "Fleet")."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from iotwatch.contract.metric_catalog import DEFAULT_INTERVAL_S
from iotwatch.contract.telemetry import DeviceType
from iotwatch.devices.config import HOME_TYPES, SimConfig
from iotwatch.devices.group import DeviceGroup, DeviceSpec
from iotwatch.devices.home import (
    AirQualityGroup,
    DoorSensorGroup,
    HomeContext,
    LeakSensorGroup,
    SmartMeterGroup,
    ThermostatGroup,
)
from iotwatch.devices.rng import CounterRng
from iotwatch.devices.vehicle import VehicleGroup

__all__ = ["Fleet", "build_fleet", "fleet_rate", "home_mix"]

_SLOTS_PER_HOME = 16
_VEHICLE_BASE = 1 << 40
_REPLAY_BASE = 1 << 41
_PHASE_STREAM = 50
_MIX_STREAM = 60
_GROUPS = {
    DeviceType.THERMOSTAT.value: ThermostatGroup,
    DeviceType.SMART_METER.value: SmartMeterGroup,
    DeviceType.AIR_QUALITY.value: AirQualityGroup,
    DeviceType.DOOR_SENSOR.value: DoorSensorGroup,
    DeviceType.LEAK_SENSOR.value: LeakSensorGroup,
}


@dataclass
class Fleet:
    groups: list[DeviceGroup]
    homes: HomeContext | None
    device_counts: dict[str, int] = field(default_factory=dict)


def home_mix(config: SimConfig, rng: CounterRng, homes: np.ndarray) -> np.ndarray:
    """Devices of each type (columns in ``HOME_TYPES`` order) per home: the fixed
    ``--mix`` or a seeded draw (thermostat 90 %, one meter, air quality 60 %, 1-3 door
    contacts, 0-2 leak sensors)."""
    if config.mix is not None:
        return np.tile(np.array([config.mix.get(t, 0) for t in HOME_TYPES], dtype=np.int64), (len(homes), 1))
    u = rng.uniform(homes.astype(np.uint64), np.zeros(len(homes), dtype=np.int64), _MIX_STREAM, 4)
    return np.column_stack(
        [u[:, 0] < 0.9, np.ones(len(homes)), u[:, 1] < 0.6, 1 + np.floor(u[:, 2] * 3), np.floor(u[:, 3] * 3)]
    ).astype(np.int64)


def _base_interval_s(config: SimConfig, device_type: str) -> float:
    if device_type == DeviceType.VEHICLE_EDR.value:
        return 1.0 / config.vehicle_hz
    if config.rate is not None:
        return 1.0 / config.rate
    return DEFAULT_INTERVAL_S[device_type]


def fleet_rate(config: SimConfig) -> tuple[float, dict[str, int]]:
    """The fleet's aggregate default rate (msg/s) and device count per type."""
    rng = CounterRng(config.seed)
    totals = home_mix(config, rng, np.arange(config.homes)).sum(axis=0)
    counts = {t: int(n) for t, n in zip(HOME_TYPES, totals, strict=True)}
    counts[DeviceType.VEHICLE_EDR.value] = config.vehicles
    rate = sum(n / _base_interval_s(config, t) for t, n in counts.items())
    return rate, {t: n for t, n in counts.items() if n}


def _rate_scale(config: SimConfig) -> float:
    if not config.target_rate:
        return 1.0
    rate, _ = fleet_rate(config)
    return config.target_rate / rate if rate else 1.0


def _specs(
    config: SimConfig, rng: CounterRng, scale: float, device_type: str, rows: list[tuple[int, str, str, int, float]]
) -> list[DeviceSpec]:
    """Specs from (uid, device_id, site, home, ramp order) rows: a random phase within
    the interval, and a start delayed by ``order * ramp_up_s``."""
    if not rows:
        return []
    interval_ms = max(1, int(round(_base_interval_s(config, device_type) * 1000.0 / scale)))
    uids = np.array([r[0] for r in rows], dtype=np.uint64)
    phases = rng.uniform(uids, np.full(len(rows), -3, dtype=np.int64), _PHASE_STREAM)[:, 0]
    first = (
        config.start_ms
        + (np.array([r[4] for r in rows]) * config.ramp_up_s * 1000.0).astype(np.int64)
        + (phases * interval_ms).astype(np.int64)
    ).tolist()
    return [
        DeviceSpec(uid, device_id, device_type, site, interval_ms, f, home)
        for (uid, device_id, site, home, _), f in zip(rows, first, strict=True)
    ]


def build_fleet(config: SimConfig, shard: int = 0, shards: int = 1) -> Fleet:
    """The groups of devices this shard simulates."""
    rng = CounterRng(config.seed)
    scale = _rate_scale(config)
    rows: dict[str, list[tuple[int, str, str, int, float]]] = {t: [] for t in HOME_TYPES}
    home_uids = list(range(shard, config.homes, shards))
    mixes = home_mix(config, rng, np.array(home_uids, dtype=np.int64)).tolist()
    for local, (h, mix) in enumerate(zip(home_uids, mixes, strict=True)):
        site = f"{config.id_prefix}home-{h:05d}"
        slot = 0
        for device_type, n in zip(HOME_TYPES, mix, strict=True):
            for k in range(n):
                rows[device_type].append(
                    (h * _SLOTS_PER_HOME + slot, f"{site}-{device_type}-{k}", site, local, h / max(config.homes, 1))
                )
                slot += 1
    groups: list[DeviceGroup] = []
    homes = HomeContext(home_uids, rng) if home_uids else None
    for device_type, device_rows in rows.items():
        if device_rows and homes is not None:
            groups.append(_GROUPS[device_type](_specs(config, rng, scale, device_type, device_rows), rng, homes))
    vehicles = _specs(
        config,
        rng,
        scale,
        DeviceType.VEHICLE_EDR.value,
        [
            (
                _VEHICLE_BASE + v,
                f"{config.id_prefix}vehicle-{v:05d}",
                f"{config.id_prefix}fleet-{v // 100:03d}",
                -1,
                v / max(config.vehicles, 1),
            )
            for v in range(shard, config.vehicles, shards)
        ],
    )
    if vehicles:
        groups.append(
            VehicleGroup(vehicles, rng, threshold_g=config.edr_threshold_g, pre_event_s=config.edr_pre_event_s)
        )
    if config.replay:
        from iotwatch.devices.recorded import RecordedSeriesGroup

        files = [(i, path) for i, path in enumerate(config.replay) if i % shards == shard]
        if files:
            groups.append(RecordedSeriesGroup(files, rng, config, _REPLAY_BASE))
    counts: dict[str, int] = {}
    for group in groups:
        counts[group.device_type] = counts.get(group.device_type, 0) + group.size
    return Fleet(groups, homes, counts)
