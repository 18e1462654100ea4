"""Spark schemas of the job's intermediate and output data (one place for all of them)."""

from __future__ import annotations

from pyspark.sql.types import (BinaryType, DoubleType, IntegerType, LongType, StringType, StructField,
                               StructType)

#: What the stateful per-device operator emits: one wide row type, told apart by ``kind``
#: (reading | alert | aggregate | duplicate | late | dlq | tally). See streaming.device_logic.
OUTPUT_SCHEMA = StructType([
    StructField("kind", StringType(), False),
    StructField("device_id", StringType()),
    StructField("device_type", StringType()),
    StructField("site", StringType()),
    StructField("seq", LongType()),
    StructField("event_ms", LongType()),
    StructField("metric", StringType()),
    StructField("value", DoubleType()),
    StructField("score", DoubleType()),
    StructField("detector", StringType()),
    StructField("quality", StringType()),
    StructField("body", StringType()),
    StructField("raw", BinaryType()),
    StructField("kafka_partition", IntegerType()),
    StructField("kafka_offset", LongType()),
])

#: Columns of the Parquet archive (the batch layer's master dataset), plus the partition
#: columns date, device_type and batch_id.
ARCHIVE_COLUMNS = ("device_id", "site", "seq", "event_ms", "event_time", "metric", "value", "score", "detector",
                   "quality")
