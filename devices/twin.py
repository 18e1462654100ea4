"""The simulated devices' twin: what each device reports, and how it applies commands
(docs/internals.md, "Twin")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from iotwatch.contract.detection import AnomalyKind
from iotwatch.contract.device_commands import SET_PROPERTIES, TwinProperties, twin_properties
from iotwatch.contract.telemetry import ContractViolation
from iotwatch.devices.group import DeviceGroup
from iotwatch.devices.home.contact import LeakSensorGroup
from iotwatch.devices.home.thermostat import ThermostatGroup
from iotwatch.devices.vehicle import VehicleGroup

#: The firmware every simulated device starts with.
FIRMWARE = "1.0.0"
#: Ends the device's active anomalies of a kind because of a command: (kind, command id) -> None.
EndAnomaly = Callable[[str, str], None]


class DeviceTwins:
    """The twin state of the simulated devices that the physics does not hold."""

    def __init__(self) -> None:
        self.valve_closed: set[str] = set()
        self.firmware: dict[str, str] = {}

    def reported(self, group: DeviceGroup, i: int) -> TwinProperties:
        """What device ``i`` of ``group`` reports."""
        device_id = group.device_ids[i]
        firmware = self.firmware.get(device_id, FIRMWARE)
        if isinstance(group, ThermostatGroup):
            return TwinProperties(setpoint_c=round(float(group.setpoint[i]), 2), firmware=firmware)
        if isinstance(group, LeakSensorGroup):
            return TwinProperties(valve="closed" if device_id in self.valve_closed else "open", firmware=firmware)
        if isinstance(group, VehicleGroup):
            return TwinProperties(limp_mode=bool(group.limp[i]), firmware=firmware)
        return TwinProperties(firmware=firmware)

    def obey(
        self, group: DeviceGroup, i: int, command: str, args: dict[str, Any], end: EndAnomaly, command_id: str
    ) -> str | None:
        """Carry out ``command``: None when done, else why the device cannot."""
        if command == SET_PROPERTIES:
            try:
                desired = twin_properties(args)
            except ContractViolation as exc:
                return exc.detail
            return self._set(group, i, desired, end, command_id)
        key = (group.device_type, command)
        if key == ("thermostat", "reset_hvac"):
            end(AnomalyKind.STUCK_HVAC.value, command_id)  # the relay unsticks
            return None
        corrective = {
            ("leak_sensor", "close_valve"): TwinProperties(valve="closed"),
            ("vehicle_edr", "limp_mode"): TwinProperties(limp_mode=bool(args.get("on", True))),
        }
        if key not in corrective:
            return f"{group.device_type} does not support {command}"
        return self._set(group, i, corrective[key], end, command_id)

    def _set(self, group: DeviceGroup, i: int, desired: TwinProperties, end: EndAnomaly, command_id: str) -> str | None:
        """Apply ``desired``, unless it names a property the device does not have."""
        have = self.reported(group, i).as_dict()
        missing = [name for name in desired.as_dict() if name not in have]
        if missing:
            return f"{group.device_type} has no {', '.join(missing)}"
        device_id = group.device_ids[i]
        if desired.firmware is not None:
            self.firmware[device_id] = desired.firmware
        if desired.setpoint_c is not None and isinstance(group, ThermostatGroup):
            group.setpoint_override[i] = group.setpoint[i] = desired.setpoint_c
        if desired.valve is not None:
            if desired.valve == "closed":
                self.valve_closed.add(device_id)
                end(AnomalyKind.WATER_LEAK.value, command_id)  # the water stops
            else:
                self.valve_closed.discard(device_id)
        if desired.limp_mode is not None and isinstance(group, VehicleGroup):
            group.limp[i] = desired.limp_mode
            if desired.limp_mode:
                end("overheating", command_id)  # a light load: the cooling keeps up again
        return None
