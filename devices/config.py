"""The options of one simulation run, as a picklable object every worker process gets."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from iotwatch.contract.telemetry import DeviceType

HOME_TYPES = (
    DeviceType.THERMOSTAT.value,
    DeviceType.SMART_METER.value,
    DeviceType.AIR_QUALITY.value,
    DeviceType.DOOR_SENSOR.value,
    DeviceType.LEAK_SENSOR.value,
)


class SimConfig(BaseModel):
    """What to simulate. Everything that changes messages is here, so equal configs give
    equal messages and ground truth (the process count does not matter)."""

    model_config = ConfigDict(frozen=True)

    seed: int = 1
    homes: int = 10
    vehicles: int = 2
    #: devices per home by type; None = each home draws its own mix (seeded)
    mix: dict[str, int] | None = None
    #: per-device reading rate (msg/s) for home devices; None = catalog default
    rate: float | None = None
    vehicle_hz: float = 10.0
    #: scale every device's rate so the fleet sums to this many msg/s
    target_rate: float | None = None
    ramp_up_s: float = 0.0
    start_ms: int = 0
    duration_s: float | None = None
    count: int | None = None
    # anomalies and transport faults
    anomaly_rate: float = 0.0  # per device per hour
    anomaly_kinds: tuple[str, ...] | None = None
    #: rate-drawn anomalies start no earlier than this many seconds of event time after the
    #: start (online detectors need history first); planned (scenario) ones are unaffected
    anomalies_after_s: float = Field(0.0, ge=0)
    fault_rate: float = 0.0  # per device per hour
    fault_kinds: tuple[str, ...] | None = None
    scenario: Path | None = None
    # vehicle event data recorder
    edr_threshold_g: float = 4.0
    edr_pre_event_s: float = 5.0
    # replay of recorded timestamp,value streams
    replay: tuple[Path, ...] = ()
    replay_device_type: str = "replay"
    replay_metric: str = "value"
    replay_keep_time: bool = False
    replay_loop: bool = False
    tick_ms: int = Field(100, ge=10)
    #: put before every device id, home and fleet name: fleets of several sites stay apart
    id_prefix: str = ""
    #: where each device's seq carries on from (iotwatch.devices.seq_state); None: every device from 0
    seq_state: Path | None = None
