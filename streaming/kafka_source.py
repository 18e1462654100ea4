"""Reading Kafka in Spark: Spark's own Kafka connector (``spark-sql-kafka-0-10``).

The connector is a Maven artifact that pip's pyspark does not ship: ``iotwatch setup`` puts it
on local sessions' classpath (:func:`iotwatch.jvm.spark.kafka_connector_conf`); a cluster passes it
to spark-submit (``--packages`` or ``--jars``). Offsets live in the query's checkpoint, so a
restarted job resumes where its last committed micro-batch ended.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from iotwatch.clients.kafka import java_client_properties
from iotwatch.errors import StackError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from iotwatch.settings import KafkaSettings

FORMAT = "kafka"
CONNECTOR_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
#: How old the consumer's topic metadata may get when it subscribes by pattern.
PATTERN_METADATA_AGE_MS = 10_000
#: How long the broker may hold a fetch that finds no new record (Kafka's default: 500 ms):
#: the next read of a partition at the end of its log waits for that fetch (docs/concepts.md,
#: "A read that keeps up does not wait on the broker").
FETCH_MAX_WAIT_MS = 1
#: How long a task reading a micro-batch's records waits for them (the connector's
#: ``kafkaConsumer.pollTimeoutMs``, 120 s by default). A Kafka outage while a task reads is
#: waited out, as the driver waits for offsets (the job's ``ingestion_gap`` says meanwhile),
#: instead of failing the query after two minutes and restarting it with a burst of errors.
POLL_TIMEOUT_MS = 3_600_000


def kafka_options(settings: KafkaSettings) -> dict[str, str]:
    """The connector's consumer options: the connection in the Java client's spelling
    (:func:`iotwatch.clients.kafka.java_client_properties`, each key prefixed ``kafka.``) and
    :data:`FETCH_MAX_WAIT_MS`."""
    return {
        **{f"kafka.{key}": value for key, value in java_client_properties(settings).items()},
        "kafka.fetch.max.wait.ms": str(FETCH_MAX_WAIT_MS),
    }


def require_connector(spark: SparkSession) -> None:
    """Say how to get the connector, instead of Spark's "Failed to find data source: kafka"."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a running session's context has its JVM
    try:
        loader = jvm.Thread.currentThread().getContextClassLoader()
        jvm.Class.forName(CONNECTOR_CLASS, False, loader)
    except Exception as exc:
        raise StackError(
            "Spark's Kafka connector is not on the classpath: run `iotwatch setup` (local mode), "
            "or give spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:<Spark's version>"
        ) from exc


def read_kafka_stream(
    spark: SparkSession,
    settings: KafkaSettings,
    topics: list[str],
    *,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    packed: bool = False,
    operator_tasks: int = 1,
    pattern: str | None = None,
) -> DataFrame:
    """A streaming DataFrame of ``topics`` (or, with ``pattern``, of every topic matching that
    regular expression, found as they appear) with the connector's columns (headers included), or
    with ``packed`` the telemetry decoded and packed in chunks (:data:`iotwatch.streaming.schemas.PACKED_SCHEMA`),
    keyed for a stateful operator of ``operator_tasks`` tasks (:mod:`iotwatch.streaming.operator_key`)."""
    require_connector(spark)
    reader = (
        spark.readStream.format(FORMAT)
        .options(**kafka_options(settings))
        .option(*(("subscribePattern", pattern) if pattern else ("subscribe", ",".join(topics))))
        .option("startingOffsets", starting_offsets)
        .option("kafkaConsumer.pollTimeoutMs", str(POLL_TIMEOUT_MS))
        # the packed path reads none of the headers (the gateway's four per record): the
        # connector would still convert each one into the row
        .option("includeHeaders", "false" if packed else "true")
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    if pattern:
        # a new site's topic is found at the consumer's next metadata refresh: seconds, not 5 min
        reader = reader.option("kafka.metadata.max.age.ms", str(PATTERN_METADATA_AGE_MS))
    frame = reader.load()
    if not packed:
        return frame
    return pack_kafka_rows(frame, operator_tasks, topics[0] if topics else None)


def pack_kafka_rows(frame: DataFrame, operator_tasks: int = 1, home_topic: str | None = None) -> DataFrame:
    """Rows with (at least) the connector's ``key, value, topic, partition, offset, timestamp``
    columns, decoded and packed in chunks (:data:`iotwatch.streaming.schemas.PACKED_SCHEMA`)
    for a stateful operator of ``operator_tasks`` tasks.

    The rows go to the packing step as the connector makes them, with no projection first:
    every Kafka record passes through the JVM here, and selecting the six columns copied each
    record into a new row (its ``timestampType`` column costs less to pass along)."""
    from iotwatch.streaming.packing import pack_records
    from iotwatch.streaming.schemas import PACKED_SCHEMA

    # One packing task per core: with more Kafka partitions than cores, tasks in waves would
    # each pay a Python task's set-up in every micro-batch.
    packer = partial(pack_records, tasks=operator_tasks, home_topic=home_topic)
    return frame.coalesce(frame.sparkSession.sparkContext.defaultParallelism).mapInArrow(packer, PACKED_SCHEMA)


def read_kafka_batch(
    spark: SparkSession,
    settings: KafkaSettings,
    topics: list[str],
    *,
    starting_offsets: str = "earliest",
    ending_offsets: str = "latest",
) -> DataFrame:
    """The records of ``topics`` between two offsets as a batch DataFrame (e.g. for replay)."""
    require_connector(spark)
    return (
        spark.read.format(FORMAT)
        .options(**kafka_options(settings))
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", starting_offsets)
        .option("endingOffsets", ending_offsets)
        .option("includeHeaders", "true")
        .load()
    )
