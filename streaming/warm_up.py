"""A warm-up micro-batch: synthetic readings through the job's operator before it reads Kafka,
so the first readings' alerts do not wait for the JVM and the workers to warm up
(docs/streaming-internals.md, "Warm-up micro-batch").
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from iotwatch.contract.metric_catalog import DEVICE_METRICS
from iotwatch.contract.telemetry import SCHEMA_VERSION, DeviceType, Telemetry
from iotwatch.settings import Settings
from iotwatch.streaming.checkpoint import committed_offsets, raw_offsets
from iotwatch.streaming.progress import OBSERVATION, batch_counts

log = logging.getLogger(__name__)

#: The synthetic devices' site (and their names' prefix): their own, so that no fleet
#: device's state or seqs are touched.
DEVICE = "iotwatch-warm-up"
#: The warm-up's longest wait for its micro-batch.
TIMEOUT_S = 120.0


def synthetic_readings(now_ms: int) -> list[Telemetry]:
    """One contract-valid reading of each device type, as the gateway writes them, so that
    every type's unpacking, scoring and archive paths run: each metric at the middle of its
    physical range (inside every danger limit), its flags off, no event."""
    return [
        Telemetry(
            v=SCHEMA_VERSION,
            device_id=f"{DEVICE}-{device_type}",
            device_type=device_type,
            site=DEVICE,
            seq=0,
            ts=now_ms,
            metrics={
                metric: 0.0 if unit == "bool" else (low + high) / 2
                for metric, (unit, low, high) in DEVICE_METRICS[device_type].items()
            },
        )
        for device_type in DeviceType
    ]


def records_waiting(settings: Settings, checkpoint: Path, timeout_s: float = 5.0) -> int | None:
    """Records of the raw topic past the checkpoint's last committed micro-batch (past the
    starting offsets for a new checkpoint); None when that cannot be told (a topic pattern,
    an unreadable checkpoint, Kafka not answering). A job with records waiting starts on them
    at once: a warm-up would only come first."""
    if settings.topics.raw_pattern:
        return None
    try:
        committed = committed_offsets(checkpoint)
    except (OSError, ValueError, IndexError):  # IndexError: an offset log cut short
        return None
    offsets = raw_offsets(settings, timeout_s)
    if offsets is None:
        return None
    waiting = 0
    for number, (log_start, end) in offsets.items():
        if committed is not None:
            start = committed.get(settings.topics.raw, {}).get(str(number), 0)
        elif settings.stream.starting_offsets.strip() == "latest":
            start = end
        else:
            start = log_start
        waiting += max(0, end - start)
    return waiting


def warm_kafka_reader(spark: SparkSession, settings: Settings) -> int:
    """Read an empty offset range of the raw topic through Spark's Kafka connector: the
    query's first offset request then finds the connector's classes loaded and its admin
    client's code compiled (cold, that first request takes about 3.5 s on two cores, and
    the devices' first readings would wait for it). The partitions whose offsets were read
    (0: none, Kafka did not answer)."""
    from iotwatch.streaming.kafka_source import read_kafka_batch

    offsets = raw_offsets(settings)
    if not offsets:
        return 0
    ends = json.dumps({settings.topics.raw: {str(number): end for number, (_, end) in offsets.items()}})
    read_kafka_batch(spark, settings.kafka, [settings.topics.raw], starting_offsets=ends, ending_offsets=ends).count()
    return len(offsets)


def run_warm_up(spark: SparkSession, settings: Settings, tasks: int) -> dict[str, Any]:
    """Run the warm-up query to its end; its batch counts and seconds (logged). A warm-up
    that fails is logged and the job starts without it."""
    started = time.monotonic()
    try:
        partitions = warm_kafka_reader(spark, settings)
        counts = {**_run(spark, settings, tasks), "kafka_partitions": partitions}
    except Exception as exc:
        counts = {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
    counts["seconds"] = round(time.monotonic() - started, 2)
    if counts.get("reading") != len(DeviceType) or counts.get("alerts_raised") or counts.get("dlq"):
        log.warning("the warm-up micro-batch did not process its readings as expected: %s", counts)
    else:
        log.info(
            "warm-up: the offsets of %d Kafka partitions read, %d readings through the operator, in %.1f s",
            counts["kafka_partitions"],
            counts["reading"],
            counts["seconds"],
        )
    return counts


def _run(spark: SparkSession, settings: Settings, tasks: int) -> dict[str, Any]:
    from iotwatch.streaming.kafka_source import pack_kafka_rows
    from iotwatch.streaming.operator_query import start_operator

    # (the stopped query's Spark threads can still be adding files there: removal is best effort)
    with tempfile.TemporaryDirectory(prefix="iotwatch-warm-up-", ignore_cleanup_errors=True) as folder:
        work = Path(folder)
        source = work / "source"
        source.mkdir()
        # as Kafka records: reading i on partition i mod tasks (every task of the operator
        # runs one, see streaming/operator_key.py), at offset i
        records = [
            {
                "key": reading.device_id,
                "value": msgspec.json.encode(reading).decode(),
                "partition": i % tasks,
                "offset": i,
            }
            for i, reading in enumerate(synthetic_readings(int(time.time() * 1000)))
        ]
        (source / "readings.json").write_text("".join(json.dumps(record) + "\n" for record in records))
        rows = spark.readStream.schema("key STRING, value STRING, partition INT, offset LONG").json(str(source))
        kafka_shaped = rows.select(
            F.col("key").cast("binary").alias("key"),
            F.col("value").cast("binary").alias("value"),
            F.lit(settings.topics.raw).alias("topic"),
            F.col("partition"),
            F.col("offset"),
            F.current_timestamp().alias("timestamp"),
        )
        packed = pack_kafka_rows(kafka_shaped, tasks, settings.topics.raw)
        no_influx = settings.model_copy(update={"influx": settings.influx.model_copy(update={"url": None})})
        query = start_operator(  # (no InfluxDB: the warm-up leaves no metrics behind)
            packed,
            no_influx,
            str(work / "archive"),
            work / "checkpoint",
            "iotwatch_warm_up",
            available_now=True,
        )
        return _first_batch(query)


def _first_batch(query: Any) -> dict[str, Any]:
    """Wait for the query's first micro-batch, stop the query; that batch's counts."""
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline and query.isActive:
            progress = next((p for p in query.recentProgress if p.batchId == 0), None)
            if progress is not None:
                return dict(batch_counts(progress.observedMetrics.get(OBSERVATION)))
            time.sleep(0.05)
        error = query.exception()
        return {"error": str(error).splitlines()[0] if error else f"no micro-batch within {TIMEOUT_S:.0f} s"}
    finally:
        from iotwatch.jvm.spark import quiet_stop

        with quiet_stop():
            query.stop()
