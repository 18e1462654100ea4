"""Home devices: one module per device type, sharing a :class:`HomeContext` per home."""

from devices.home.air_quality import AirQualityGroup
from devices.home.contact import DoorSensorGroup, LeakSensorGroup
from devices.home.context import HomeContext
from devices.home.meter import SmartMeterGroup
from devices.home.thermostat import ThermostatGroup

__all__ = ["AirQualityGroup", "DoorSensorGroup", "HomeContext", "LeakSensorGroup", "SmartMeterGroup", "ThermostatGroup"]
