"""Spark schemas of the job's intermediate and output data (one place for all of them)."""

from __future__ import annotations

from pyspark.sql.types import (ArrayType, BinaryType, BooleanType, DoubleType, IntegerType, LongType, StringType,
                               StructField, StructType)


def _arrays(element: object, *names: str) -> list[StructField]:
    return [StructField(name, ArrayType(element)) for name in names]  # type: ignore[arg-type]


#: Kafka records after decoding (``streaming.packing``): one row per chunk of consecutive
#: records of one Kafka partition, each column an array with one element per record (the
#: metrics flattened, ``metric_row`` pointing at their record). Few rows, so Spark's
#: per-row costs in the stateful operator do not count.
PACKED_SCHEMA = StructType([
    StructField("partition", IntegerType(), False),
    StructField("first_offset", LongType(), False),
    *_arrays(LongType(), "offset", "append_ms", "seq", "ts", "metric_row"),
    *_arrays(StringType(), "key", "reason", "detail", "device_id", "device_type", "site", "event", "metric_name"),
    *_arrays(DoubleType(), "metric_value"),
    *_arrays(BinaryType(), "raw"),
])

#: What the stateful operator emits: one wide row type, told apart by ``kind`` (reading |
#: alert | aggregate | dlq | late | tally). A ``reading`` row carries the reading's metrics
#: as parallel arrays (``names``, ``values``, their detector ``scores`` -- NaN where not
#: scored -- and ``out_of_range`` flags). See :mod:`streaming.engine`.
OUTPUT_SCHEMA = StructType([
    StructField("kind", StringType(), False),
    StructField("device_id", StringType()),
    StructField("device_type", StringType()),
    StructField("site", StringType()),
    StructField("seq", LongType()),
    StructField("event_ms", LongType()),
    StructField("kafka_partition", IntegerType()),
    StructField("kafka_offset", LongType()),
    StructField("metric", StringType()),
    StructField("value", DoubleType()),
    StructField("score", DoubleType()),
    StructField("state", StringType()),
    StructField("names", ArrayType(StringType())),
    StructField("values", ArrayType(DoubleType())),
    StructField("scores", ArrayType(DoubleType())),
    StructField("out_of_range", ArrayType(BooleanType())),
    StructField("body", StringType()),
    StructField("raw", BinaryType()),
])

#: The ``values`` of an ``aggregate`` output row, in order.
AGGREGATE_STATS = ("count", "sum", "min", "max", "last", "max_score", "mean")

#: One device's state in the state store (see :class:`streaming.device_state.DeviceState`).
DEVICE_STATE_SCHEMA = StructType([
    StructField("device_type", StringType()), StructField("site", StringType()),
    StructField("metrics", StringType()), StructField("core", BinaryType()), StructField("seqs", BinaryType()),
    StructField("episodes", BinaryType()), StructField("peaks", BinaryType()), StructField("detectors", BinaryType()),
    StructField("last", BinaryType()), StructField("buckets", BinaryType()),
])

#: Per Kafka partition: the devices seen, when each was last heard of and whether its
#: silence was reported (see :class:`streaming.processor.Roster`).
ROSTER_SCHEMA = StructType([
    StructField("devices", StringType()), StructField("last_wall_ms", BinaryType()),
    StructField("silent", BinaryType()), StructField("timer_ms", LongType()),
])

#: Columns of the Parquet archive (the batch layer's master dataset): one row per reading,
#: its metrics and detector scores as maps, plus the partition columns date, device_type
#: and batch_id.
ARCHIVE_COLUMNS = ("device_id", "site", "seq", "event_ms", "event_time", "metrics", "scores", "out_of_range",
                   "detector")
