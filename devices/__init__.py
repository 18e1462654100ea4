"""Simulated devices: homes (thermostat, smart meter, air quality, door and leak sensors)
and vehicle event data recorders publishing contract telemetry over MQTT (``iotwatch simulate``,
docs/operate/simulators.md). What they measure is the contract's metric catalogue
(:mod:`iotwatch.contract.metric_catalog`), which the streaming job's checks read too.
"""
