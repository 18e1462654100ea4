"""Simulated devices: homes (thermostat, smart meter, air quality, door and leak sensors)
and vehicle event data recorders publishing contract telemetry over MQTT.

- the metrics they publish, with units, physical ranges and danger limits, are the
  contract's metric catalogue (:mod:`iotwatch.contract.metric_catalog`), which the streaming job's
  checks read too;
- :mod:`iotwatch.devices.home`, :mod:`iotwatch.devices.vehicle`, :mod:`iotwatch.devices.recorded` -- the device models;
- :mod:`iotwatch.devices.anomaly_kinds`, :mod:`iotwatch.devices.faults`, :mod:`iotwatch.devices.injector`,
  :mod:`iotwatch.devices.scenario`, :mod:`iotwatch.contract.ground_truth` -- injection with ground truth (its record);
- :mod:`iotwatch.devices.simulation` -- the broker-free, deterministic message generator;
- :mod:`iotwatch.devices.publisher`, :mod:`iotwatch.devices.broker_run`, :mod:`iotwatch.devices.cli` --
  ``iotwatch simulate``;
- :mod:`iotwatch.application.bench.simulate` -- ``iotwatch bench simulate``.
"""
