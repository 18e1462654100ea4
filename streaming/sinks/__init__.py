"""Where each kind of output goes: Kafka topics, the Parquet archive, InfluxDB -- all
written by the stateful task that produced it.

Every sink is idempotent or keyed so that re-running a micro-batch after a failure
(Spark's at-least-once) changes nothing a consumer cares about: alerts carry
deterministic ids, dead letters carry their source offsets, archive files are named
after the Kafka offsets they hold and overwritten, InfluxDB points overwrite the same
series and timestamp.
"""
