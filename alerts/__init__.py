"""On-call tools for the alert topic, the ``iotwatch alerts`` commands: ``tail`` (follow alerts
live), ``list`` (each alert's on-call state), ``ack`` and ``unack`` (acknowledgements),
``silence``, ``silences`` and ``unsilence`` (muting notifications), and ``forward`` (deliver
alerts to a webhook, or route them to receivers by a policy tree).

The alert records are :class:`iotwatch.contract.alerts.AlertRecord`, written by the streaming
job and the responder; the on-call state is folded from them and the on-call topics
(:mod:`iotwatch.contract.oncall`) by :mod:`iotwatch.alerts.book`, so every tool rebuilds it from Kafka
and runs anywhere with Kafka access without affecting the pipeline.
"""
