"""The contract: every record that crosses a process boundary, one typed, versioned
definition each, used by its producers, its consumers and the tests.

Where each record travels, who writes it and who reads it (record: where it travels;
producers -> consumers):

- :class:`.telemetry.Telemetry`: MQTT ``iot/<site>/<type>/<id>/telemetry``, then the raw
  Kafka topic; devices (simulators) -> gateway (validates), streaming job.
- device status (:func:`.device_topics.status_payload`): MQTT ``.../status``, retained;
  devices and their last will (``lost``) -> ``devices show``, a site's relay. A clean stop is
  also a last reading with the goodbye event (:data:`.telemetry.GOODBYE_EVENT`), which the
  streaming job reads: the device is offline, not silent.
- :class:`.device_commands.Command`: MQTT ``.../commands``; responder, ``iotwatch devices set``
  -> devices. :class:`.device_commands.CommandReply`: ``.../commands/ack``; devices -> responder.
  :class:`.device_commands.TwinReport`: ``.../twin/reported``; devices -> responder.
- :class:`.alerts.AlertRecord`: the alert topic; streaming job, responder (escalations)
  -> ``alerts tail``/``forward``/``list``, responder, demo, ``replay``, bench.
- :mod:`.oncall` records (alert state, silences, notifications, command audits, twins,
  emergencies): the on-call topics; the on-call tools, forwarder and responder -> the same.
- :class:`.dead_letters.DeadLetter`: the dead-letter topic (original bytes, the reason in
  headers); gateway, streaming job, responder, forwarder -> operators, the demo's accounting.
- :class:`.model_updates.ModelUpdate`: the model-updates topic; model registry
  (``iotwatch train``) -> the streaming job's model watcher.
- :mod:`.measurements`: InfluxDB points (aggregates and metrics); streaming job, gateway,
  forwarder, responder -> Grafana dashboards.
- :mod:`.detection`: the rule names alerts carry and the anomaly kinds the simulators'
  ground truth carries, with the rules that may report each kind.
- :class:`.ground_truth.Injection`: JSON lines beside a simulator run
  (``simulate --ground-truth``), one per injected anomaly or transport fault; simulators ->
  the one evaluator of alerts (``iotwatch.evaluation.judgement``: ``evaluate --simulated``,
  the demo), the demo's loss accounting, ``evaluate --readings --truth``.

The metric catalogue (:mod:`.metric_catalog`: units, physical ranges, danger limits,
which metrics are scored) is part of the contract: the simulators publish by it and the
job cleans and judges by it.

Import a name from the module that defines it (``from iotwatch.contract.alerts import
AlertRecord``): one home per name.
"""
