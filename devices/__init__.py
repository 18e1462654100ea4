"""Simulated devices: homes (thermostat, smart meter, air quality, door and leak sensors)
and vehicle event data recorders publishing contract telemetry over MQTT.

- the metrics they publish, with units, physical ranges and danger limits, are the
  contract's metric catalogue (:mod:`iotwatch.contract.metric_catalog`), which the streaming job's
  checks read too;
- :mod:`devices.home`, :mod:`devices.vehicle`, :mod:`devices.recorded` -- the device models;
- :mod:`devices.anomaly_kinds`, :mod:`devices.faults`, :mod:`devices.injector`,
  :mod:`devices.scenario`, :mod:`iotwatch.contract.ground_truth` -- injection with ground truth (its record);
- :mod:`devices.simulation` -- the broker-free, deterministic message generator;
- :mod:`devices.publisher`, :mod:`devices.broker_run`, :mod:`devices.cli` -- ``iotwatch simulate``;
- :mod:`benchmarks.simulate` -- ``iotwatch bench simulate``.
"""
