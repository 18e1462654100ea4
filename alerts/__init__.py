"""On-call tools for the alert topic: ``iotwatch alerts tail`` and ``iotwatch alerts forward``.

The streaming job publishes alert records (see :mod:`streaming.alerting`) as JSON values
keyed by device id; these tools only read that topic, so they can run anywhere with
Kafka access and never affect the pipeline.
"""
