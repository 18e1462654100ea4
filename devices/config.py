"""The options of one simulation run, as picklable objects every worker process gets: what to
simulate (:class:`SimConfig`) and how to publish it (:class:`RunOptions`); ``iotwatch simulate``
makes its options from their fields."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import click
from pydantic import BaseModel, ConfigDict, Field

from iotwatch.cli import Opt
from iotwatch.contract.telemetry import DeviceType
from iotwatch.settings import MqttSettings

HOME_TYPES = (
    DeviceType.THERMOSTAT.value,
    DeviceType.SMART_METER.value,
    DeviceType.AIR_QUALITY.value,
    DeviceType.DOOR_SENSOR.value,
    DeviceType.LEAK_SENSOR.value,
)

_POSITIVE = click.FloatRange(min=0, min_open=True)
_NON_NEGATIVE = click.FloatRange(min=0)
_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


class SimConfig(BaseModel):
    """What to simulate. Everything that changes messages is here, so equal configs give
    equal messages and ground truth (the process count does not matter)."""

    model_config = ConfigDict(frozen=True)

    seed: int = 1
    homes: Annotated[int, Opt("Homes to simulate.", click.IntRange(min=0))] = 10
    vehicles: Annotated[int, Opt("Vehicles with event data recorders.", click.IntRange(min=0))] = 2
    #: devices per home by type; None = each home draws its own mix (seeded)
    mix: dict[str, int] | None = None
    rate: Annotated[float | None, Opt("Readings/s per home device [default: 1].", _POSITIVE)] = None
    vehicle_hz: Annotated[float, Opt("Readings/s per vehicle.", _POSITIVE)] = 10.0
    target_rate: Annotated[
        float | None, Opt("Aggregate msg/s of the fleet (scales every device's rate).", _POSITIVE)
    ] = None
    ramp_up_s: Annotated[
        float, Opt("Seconds over which devices come online one after another.", _NON_NEGATIVE, "--ramp-up")
    ] = 0.0
    start_ms: int = 0
    duration_s: Annotated[
        float | None,
        Opt(
            "Seconds of event time to simulate (default: until --count, end of replay or Ctrl-C).",
            _POSITIVE,
            "--duration",
        ),
    ] = None
    count: Annotated[int | None, Opt("Stop after this many readings.", click.IntRange(min=1))] = None
    # anomalies and transport faults
    anomaly_rate: Annotated[float, Opt("Anomalies per device per hour of event time.", _NON_NEGATIVE)] = 0.0
    anomaly_kinds: tuple[str, ...] | None = None
    anomalies_after_s: Annotated[
        float,
        Field(ge=0),
        Opt(
            "Start --anomaly-rate anomalies only after this many seconds of event time "
            "(a warm-up for online detectors; --scenario times are kept).",
            _NON_NEGATIVE,
            "--anomalies-after",
            "SECONDS",
        ),
    ] = 0.0
    fault_rate: Annotated[float, Opt("Transport faults per device per hour of event time.", _NON_NEGATIVE)] = 0.0
    fault_kinds: tuple[str, ...] | None = None
    scenario: Annotated[
        Path | None, Opt("JSON or TOML file of planned anomalies/faults (see devices/scenario.py).", _FILE)
    ] = None
    # vehicle event data recorder
    edr_threshold_g: Annotated[float, Opt("Deceleration (g) that triggers a vehicle's crash event.", _POSITIVE)] = 4.0
    edr_pre_event_s: Annotated[float, Opt("Seconds of readings the crash event carries.", _POSITIVE)] = 5.0
    # replay of recorded timestamp,value streams
    replay: Annotated[
        tuple[Path, ...],
        Opt(
            "Replay a timestamp,value CSV as a device (repeatable); replaces the simulated fleet "
            "unless --homes/--vehicles are given too.",
            _FILE,
            multiple=True,
        ),
    ] = ()
    replay_device_type: Annotated[str, Opt("device_type of replayed streams.", flag="--replay-type")] = "replay"
    replay_metric: Annotated[str, Opt("Metric name of replayed values.")] = "value"
    replay_keep_time: Annotated[bool, Opt("Keep the recorded timestamps instead of starting now.", is_flag=True)] = (
        False
    )
    replay_loop: Annotated[bool, Opt("Start a stream over when it ends.", is_flag=True)] = False
    tick_ms: Annotated[
        int,
        Field(ge=10),
        Opt("Virtual-time step of the scheduler (part of the determinism key).", click.IntRange(min=10)),
    ] = 100
    id_prefix: Annotated[
        str,
        Opt("Put before every device id and home or fleet name (e.g. site1-): simulators of several sites stay apart."),
    ] = ""
    #: where each device's seq carries on from (iotwatch.devices.seq_state); None: every device from 0
    seq_state: Path | None = None


@dataclass(frozen=True)
class RunOptions:
    """How to publish (none of this changes the messages)."""

    mqtt: MqttSettings
    qos: int = 0
    processes: Annotated[
        int, Opt("Worker processes (the fleet is split by home and vehicle).", click.IntRange(min=1))
    ] = 1
    connections: Annotated[int, Opt("MQTT connections per process shared by its devices.", click.IntRange(min=1))] = 2
    per_device: Annotated[
        bool,
        Opt(
            "One MQTT connection per device, each with its own last will (small fleets).",
            flag="--connection-per-device",
            is_flag=True,
        ),
    ] = False
    speedup: Annotated[
        float, Opt("Event time runs this many times faster than wall-clock time.", click.FloatRange(0, min_open=True))
    ] = 1.0
    as_fast_as_possible: Annotated[
        bool,
        Opt("No pacing: stamp event times on a virtual clock and publish as fast as the broker takes.", is_flag=True),
    ] = False
    max_inflight: Annotated[
        int,
        Opt("QoS 1 messages in flight per connection (as many again wait, ready to send).", click.IntRange(min=1)),
    ] = 200
    client_prefix: Annotated[
        str | None, Opt("MQTT client id prefix (default iotwatch-sim-<random>).", flag="--client-id-prefix")
    ] = None
    ground_truth: Annotated[
        Path | None,
        Opt("Write injected anomalies and faults here as JSONL.", click.Path(dir_okay=False, path_type=Path)),
    ] = None
    progress: bool = False
    obey_commands: Annotated[
        bool,
        Opt(
            "Receive commands for the simulated devices (QoS 1, persistent session per --client-id-prefix) "
            "and obey them: reset_hvac ends a stuck HVAC, close_valve a leak.",
            is_flag=True,
        ),
    ] = False
