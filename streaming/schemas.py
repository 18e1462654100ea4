"""Spark schemas of the job's intermediate and output data (one place for all of them)."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from iotwatch.contract.metric_catalog import DERIVED_METRICS, DEVICE_METRICS, NOT_SCORED


def _arrays(element: DataType, *names: str) -> list[StructField]:
    return [StructField(name, ArrayType(element)) for name in names]


#: String columns of the packed rows with few distinct values among many entries (a chunk's
#: records are a few devices' readings): sent as codes into the chunk's own dictionary, the
#: column :func:`dictionary_of` it (-1 for None), so a chunk carries each string once.
DICTIONARY_COLUMNS = ("device_id", "device_type", "site", "event", "metric_name")


def dictionary_of(column: str) -> str:
    return f"{column}_dictionary"


#: The numeric columns of the packed rows and their element types: each is one binary value,
#: the column's elements as little-endian bytes of that type (:func:`iotwatch.streaming.packing.packed_column`).
#: A packed row crosses the JVM three times (from the packing step's Arrow into Spark's row,
#: through the shuffle, into Arrow for the stateful operator): an array column is copied there
#: element by element, with a null bit each -- a fifth of the JVM's CPU in those stages, at a
#: few dozen elements per record -- and a binary value in one copy.
PACKED_BUFFERS: dict[str, str] = {
    **dict.fromkeys(("offset", "append_ms", "seq", "ts"), "<i8"),
    "metric_row": "<i4",  # the entry's record in its chunk (packing.CHUNK_RECORDS)
    "rejected": "<i4",  # the records the decoder rejected; key, reason, detail and raw are theirs
    **dict.fromkeys(DICTIONARY_COLUMNS, "<i4"),
    "metric_value": "<f8",
}

#: Kafka records after decoding (``iotwatch.streaming.packing``): one row per chunk of consecutive
#: records of one Kafka partition, each column one element per record (the metrics flattened,
#: ``metric_row`` pointing at their record; ``key``, ``reason``, ``detail`` and ``raw`` only
#: for the ``rejected`` records; the :data:`DICTIONARY_COLUMNS` as codes), numeric ones as
#: :data:`PACKED_BUFFERS`. Few rows, so Spark's per-row costs in the stateful operator do not count.
PACKED_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("operator_key", LongType(), False),  # the grouping key: iotwatch.streaming.operator_key
        StructField("first_offset", LongType(), False),
        *(StructField(name, BinaryType(), False) for name in PACKED_BUFFERS),
        *_arrays(StringType(), "key", "reason", "detail"),
        *_arrays(BinaryType(), "raw"),
        *_arrays(StringType(), *(dictionary_of(name) for name in DICTIONARY_COLUMNS)),
    ]
)

#: Every metric the catalog knows (and the derived ones): each has a column of its own in
#: the operator's output and the archive, so a reading costs no per-row Python objects.
#: Metrics outside the catalog travel in the ``extra_*`` arrays.
WIDE_METRICS = tuple(sorted({m for metrics in DEVICE_METRICS.values() for m in metrics} | set(DERIVED_METRICS)))
#: Those the statistical detectors score (a score column each).
SCORED_METRICS = tuple(m for m in WIDE_METRICS if m not in NOT_SCORED)


def value_column(metric: str) -> str:
    return f"m__{metric}"


def score_column(metric: str) -> str:
    return f"s__{metric}"


#: The rows of scored readings (:attr:`iotwatch.streaming.partition_io.BatchOutput.readings`): a fixed wide
#: layout -- a value column per catalogued metric and a score column per scored one, NaN
#: where the reading has none; uncatalogued metrics in the ``extra_*`` arrays; the names of
#: out-of-range metrics. The stateful task archives them itself
#: (:mod:`iotwatch.streaming.sinks.archive`); they do not pass through Spark.
READING_COLUMNS = (
    "kind",
    "device_id",
    "device_type",
    "site",
    "seq",
    "event_ms",
    "kafka_partition",
    "kafka_offset",
    "body",
    *(value_column(m) for m in WIDE_METRICS),
    *(score_column(m) for m in SCORED_METRICS),
    "out_of_range",
    "extra_names",
    "extra_values",
    "extra_scores",
)

#: The counters of one partition and micro-batch (or timer firing), as the stateful
#: operator reports them, mapped to their names in the job's totals.
TALLY_FIELDS = {
    "received": "received",
    "scored": "reading_records",
    "duplicates": "duplicate",
    "late": "late",
    "dead_lettered": "dlq",
    "clock_steps": "clock_steps",
    "seq_resets": "seq_resets",
    "no_device": "no_device",
    "alerts_raised": "alerts_raised",
    "alerts_cleared": "alerts_cleared",
    "aggregates": "aggregate",
    "archive_files": "archive_files",
    "influx_write_failures": "influx_write_failures",
    "state_bytes": "state_bytes",
    "state_devices": "state_devices",
    "state_shards_read": "state_shards_read",
    "state_shards_cached": "state_shards_cached",
    "goodbyes": "goodbyes",  # devices whose status said offline: marked offline, not silent
    "devices_reporting": "devices_reporting",
    "silence_held": "silence_held",
    # milliseconds the Python worker spends per step, summed over the partitions (where a
    # micro-batch's time goes inside the stateful operator, beside Spark's own phases)
    **{f"ms_{step}": f"worker_ms_{step}" for step in ("unpack", "engine", "sinks", "archive", "roster")},
}
#: The per-step worker times of :data:`TALLY_FIELDS`, under their totals' names.
WORKER_STEP_LABELS = tuple(label for name, label in TALLY_FIELDS.items() if name.startswith("ms_"))

#: What the stateful operator emits: one tally row per partition and call, its counters one
#: array in the order of :data:`TALLY_FIELDS`. Alerts, dead letters, aggregates and the archive
#: are written by the operator itself (:mod:`iotwatch.streaming.sinks`), so only these few
#: numbers reach the driver, collected by an observation on the stream and summed there
#: (:func:`iotwatch.streaming.progress.batch_counts`). One collected column, not a sum per
#: counter: Spark generates the code of an observation's aggregation afresh in every task of
#: every micro-batch, and for some thirty sums that was a tenth of the JVM's CPU at 2,000-record
#: micro-batches.
TALLY_SCHEMA = StructType(
    [StructField("kafka_partition", IntegerType(), False), StructField("counts", ArrayType(LongType(), False))]
)

#: The statistics of an aggregate (one per device, metric and event-time bucket).
AGGREGATE_STATS = ("count", "sum", "min", "max", "last", "max_score", "mean")

#: One shard of a partition's device states in the state store: its devices' state as one
#: serialised :class:`iotwatch.streaming.device_table.DeviceTable` (see
#: :class:`iotwatch.streaming.state_store.ShardedStore`).
DEVICE_SHARD_SCHEMA = StructType([StructField("devices", BinaryType())])
#: Its key, the shard's number (a schema, not the DDL text "shard int": the JVM would parse
#: that, one more round trip to the state server in every stateful task).
SHARD_KEY_SCHEMA = StructType([StructField("shard", IntegerType())])

#: Per Kafka partition: the token of each shard's local copy, an int64 per shard
#: (:mod:`iotwatch.streaming.shard_cache`).
SHARD_TOKENS_SCHEMA = StructType([StructField("tokens", BinaryType())])

#: Per Kafka partition: the devices seen, when each was last heard of and whether its
#: silence was reported (see :class:`iotwatch.streaming.roster.Roster`).
ROSTER_SCHEMA = StructType(
    [
        StructField("devices", StringType()),
        StructField("last_wall_ms", BinaryType()),
        StructField("silent", BinaryType()),
        StructField("timer_ms", LongType()),
    ]
)
