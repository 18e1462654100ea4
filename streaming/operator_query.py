"""The job's query: its stateful operator over packed Kafka rows, into a no-op sink.

One place builds it, so that the job (:mod:`iotwatch.streaming.job`) and its warm-up
(:mod:`iotwatch.streaming.warm_up`) run exactly the same operator.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql.streaming import StreamingQuery

from iotwatch.settings import Settings
from iotwatch.streaming.operator_key import OPERATOR_KEY
from iotwatch.streaming.processor import PartitionProcessor
from iotwatch.streaming.progress import OBSERVATION, tally_sums
from iotwatch.streaming.schemas import TALLY_SCHEMA


def start_operator(
    packed: DataFrame, settings: Settings, archive: str, checkpoint: Path, query_name: str, available_now: bool
) -> StreamingQuery:
    """Start the job's stateful operator over ``packed`` rows (:func:`iotwatch.streaming.kafka_source.pack_kafka_rows`),
    offsets and state in ``checkpoint``."""
    tallies = packed.groupBy(OPERATOR_KEY).transformWithStateInPandas(
        statefulProcessor=PartitionProcessor(settings, archive),
        outputStructType=TALLY_SCHEMA,
        outputMode="Append",
        timeMode="ProcessingTime",
    )
    # Every output is written by the stateful operator itself; what reaches the sink is one
    # tally row per partition, collected by the observation. The no-op sink runs the batch.
    sink = (
        tallies.observe(OBSERVATION, *tally_sums())
        .writeStream.format("noop")
        .queryName(query_name)
        .option("checkpointLocation", str(checkpoint))
    )
    sink = (
        sink.trigger(availableNow=True)
        if available_now
        else sink.trigger(processingTime=f"{settings.stream.trigger_interval_s} seconds")
    )
    return sink.start()
