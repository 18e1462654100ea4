"""Where each kind of output row goes: Kafka topics, the Parquet archive, InfluxDB.

Every sink is idempotent or keyed so that re-running a micro-batch after a failure
(Spark's at-least-once) changes nothing a consumer cares about: alerts carry
deterministic ids, dead letters carry their source offsets, archive files are
overwritten per batch, InfluxDB points overwrite the same series and timestamp.
"""
