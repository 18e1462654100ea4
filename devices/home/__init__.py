"""Home devices: one module per device type, sharing a :class:`HomeContext` per home."""

from iotwatch.devices.home.air_quality import AirQualityGroup
from iotwatch.devices.home.contact import DoorSensorGroup, LeakSensorGroup
from iotwatch.devices.home.context import HomeContext
from iotwatch.devices.home.meter import SmartMeterGroup
from iotwatch.devices.home.thermostat import ThermostatGroup

__all__ = ["AirQualityGroup", "DoorSensorGroup", "HomeContext", "LeakSensorGroup", "SmartMeterGroup", "ThermostatGroup"]
