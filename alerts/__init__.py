"""On-call tools for the alert topic, the ``iotwatch alerts`` commands (docs/operate/oncall.md):
each rebuilds the on-call state from Kafka (:mod:`iotwatch.alerts.book`), so it runs anywhere
with Kafka access without affecting the pipeline.
"""
