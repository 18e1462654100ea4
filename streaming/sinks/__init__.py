"""Where each kind of output goes: Kafka topics, the Parquet archive, InfluxDB -- all
written by the stateful task that produced it.

Every sink is idempotent or keyed, so a micro-batch re-run after a failure changes nothing
a consumer cares about (docs/streaming-internals.md, "Event sinks" and "The archive sink").
"""
