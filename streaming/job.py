"""The streaming job: Kafka -> per-device stateful cleaning and scoring -> sinks.

The same code runs in local mode (``iotwatch stream``) and under ``spark-submit`` on a
cluster (``python -m streaming.job`` as the application, master from spark-submit): the
scale-out path is Spark's -- Kafka partitions read in parallel by executors, state
sharded by device over ``shuffle_partitions`` -- not ours.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from iotwatch.clients.influx import InfluxV1Client
from iotwatch.errors import IotwatchError
from iotwatch.settings import Settings, StreamSettings
from streaming.kafka_source import read_kafka_stream
from streaming.processor import PartitionProcessor
from streaming.schemas import OUTPUT_SCHEMA
from streaming.sinks.batch_writer import BatchWriter
from streaming.sinks.influx_points import pipeline_point

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


#: The job's Spark settings: RocksDB state store (transformWithState needs it); archive
#: files written without sorting rows by their partition (one writer per date and device
#: type open at a time).
STREAM_CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.noDataMicroBatches.enabled": "true",
    "spark.sql.maxConcurrentOutputFileWriters": "32",
}


def spark_session(settings: StreamSettings, app_name: str = "iotwatch-stream") -> SparkSession:
    """A session for the job (the master is left to spark-submit when running under it)."""
    from iotwatch.spark import spark_session as session

    return session(app_name, settings.spark_master, shuffle_partitions=settings.shuffle_partitions, conf=STREAM_CONF)


class ProgressReporter(StreamingQueryListener):
    """Query progress -> InfluxDB ``pipeline`` points (rates, batch duration, Kafka lag)."""

    def __init__(self, settings: Settings, query_name: str) -> None:
        self.influx = settings.influx if settings.influx.enabled else None
        self.query_name = query_name
        self.last: dict[str, Any] = {}
        self.history: list[dict[str, Any]] = []  # every batch's fields, for summaries and benchmarks

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if progress.name != self.query_name:
            return
        records = kafka_records(progress)
        trigger_ms = int(progress.durationMs.get("triggerExecution", 0))
        rows = int(progress.numInputRows)
        fields = {
            "input_rows": records,  # Kafka records, not Spark rows (the source packs records in chunks)
            "input_rows_per_s": float(progress.inputRowsPerSecond or 0.0) * records / rows if rows else 0.0,
            "processed_rows_per_s": records * 1000 / trigger_ms if trigger_ms else 0.0,
            "trigger_ms": trigger_ms,
            "lag_records": kafka_lag(progress),
            "state_rows": int(sum(op.numRowsTotal for op in progress.stateOperators)),
            "state_memory_bytes": int(sum(op.memoryUsedBytes for op in progress.stateOperators)),
        }
        self.last = fields
        self.history.append(fields)
        if self.influx is not None:
            client = InfluxV1Client(self.influx)
            try:
                client.write_points([pipeline_point(fields, int(time.time() * 1000), stage="stream_progress")])
            except IotwatchError as exc:
                log.warning("progress not written to InfluxDB: %s", exc)
            finally:
                client.close()


def _offsets(value: Any) -> dict[str, dict[str, int]] | None:
    """A source's offsets in a progress event (JSON text or already parsed)."""
    import json

    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except (TypeError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _distance(since: dict[str, dict[str, int]] | None, until: dict[str, dict[str, int]] | None) -> int | None:
    """Records between two offset maps, over all partitions."""
    if since is None or until is None:
        return None
    return sum(max(0, int(offset) - int(since.get(topic, {}).get(partition, 0)))
               for topic, partitions in until.items() for partition, offset in partitions.items())


def kafka_lag(progress: Any) -> int | None:
    """Records between what the last batch read and the log end, over all partitions."""
    total = 0
    for source in progress.sources:
        lag = _distance(_offsets(source.endOffset), _offsets(source.latestOffset))
        if lag is None:
            return None
        total += lag
    return total


def kafka_records(progress: Any) -> int:
    """Kafka records the batch read (its offset ranges), whatever rows the source made of them."""
    return sum(_distance(_offsets(source.startOffset) or {}, _offsets(source.endOffset)) or 0
               for source in progress.sources)


@dataclass
class RunningJob:
    spark: SparkSession
    query: StreamingQuery
    writer: BatchWriter
    reporter: ProgressReporter

    def caught_up(self) -> bool:
        """The backlog is processed: the query ended, or its last batch read nothing and no
        more data is waiting. (With state TTL and silence timers, Spark keeps running
        no-data batches even after an availableNow trigger has read everything.)"""
        if not self.query.isActive:
            return True
        progress = self.query.lastProgress
        return bool(progress and progress["batchId"] >= 0 and progress["numInputRows"] == 0
                    and not self.query.status["isDataAvailable"] and self.writer.totals.get("batches", 0) > 0)

    def await_backlog(self, timeout_s: float) -> None:
        """Block until :meth:`caught_up` (or the query failed), then stop the query."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.caught_up():
            time.sleep(0.5)
        self.stop()

    def stop(self) -> None:
        """Stop the query (idempotent; tolerates a JVM already shutting down)."""
        try:
            self.query.stop()
            self.spark.streams.removeListener(self.reporter)
        except Exception as exc:  # noqa: BLE001 - py4j errors when the JVM is going away
            log.warning("stopping the query: %s", str(exc).splitlines()[0])


def start(spark: SparkSession, settings: Settings, *, checkpoint_dir: Path | None = None,
          archive_dir: Path | None = None, available_now: bool = False,
          query_name: str = "iotwatch_stream") -> RunningJob:
    """Start the query; offsets and state are kept in ``checkpoint_dir``."""
    stream = settings.stream
    checkpoint = Path(checkpoint_dir or stream.checkpoint_dir).expanduser().resolve()
    archive = Path(archive_dir or stream.archive_dir).expanduser().resolve()
    packed = read_kafka_stream(spark, settings.kafka, [settings.topics.raw], starting_offsets=stream.starting_offsets,
                               max_offsets_per_trigger=stream.max_offsets_per_trigger, source=stream.kafka_source,
                               packed=True)
    scored = packed.groupBy("partition").transformWithStateInPandas(
        statefulProcessor=PartitionProcessor(settings), outputStructType=OUTPUT_SCHEMA,
        outputMode="Append", timeMode="ProcessingTime")
    writer = BatchWriter(settings, archive)
    reporter = ProgressReporter(settings, query_name)
    spark.streams.addListener(reporter)
    sink = (scored.writeStream.foreachBatch(writer).queryName(query_name)
            .option("checkpointLocation", str(checkpoint)))
    sink = sink.trigger(availableNow=True) if available_now else sink.trigger(
        processingTime=f"{stream.trigger_interval_s} seconds")
    log.info("streaming %s from %s; checkpoint %s; archive %s", settings.topics.raw,
             settings.kafka.bootstrap_servers, checkpoint, archive)
    warm_python_workers(spark)
    return RunningJob(spark, sink.start(), writer, reporter)


def _warm_worker(_: object) -> None:
    """In a Python worker: import the job's modules and load its compiled kernels."""
    from models.kernels import warm_all
    from streaming import processor, sequencing  # noqa: F401 - imported for its import cost

    warm_all()
    sequencing.warm()


def warm_python_workers(spark: SparkSession) -> threading.Thread:
    """Start the executors' Python workers and load the job's modules and compiled kernels
    while the query plans its first micro-batch, in a background job: workers are reused,
    so the first batch finds them ready instead of paying their start-up."""
    slots = max(1, spark.sparkContext.defaultParallelism)

    def run() -> None:
        try:
            spark.sparkContext.parallelize(range(slots), slots).foreach(_warm_worker)
        except Exception as exc:  # noqa: BLE001 - an optimisation: the query starts workers itself anyway
            log.debug("warming Python workers: %s", str(exc).splitlines()[0])

    thread = threading.Thread(target=run, name="warm-python-workers", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> None:
    """Entry point for spark-submit (``spark-submit --master spark://… streaming/job.py``):
    settings from IOTWATCH_* and IOTWATCH_CONFIG, the master and resources from spark-submit.
    Runs like ``iotwatch stream``: until SIGTERM, ``--duration``, or with ``--available-now``
    until the backlog is processed; then prints the totals as JSON."""
    import argparse
    import json

    import click

    from iotwatch.settings import load_settings
    from streaming.cli import run_job

    parser = argparse.ArgumentParser(prog="streaming/job.py", description=main.__doc__)
    parser.add_argument("--available-now", action="store_true", help="process what is in Kafka now, then stop")
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        job = run_job(load_settings(), None, None, available_now=args.available_now, duration=args.duration)
    except click.ClickException as exc:
        raise SystemExit(f"iotwatch stream: {exc.message}") from exc
    print(json.dumps({"batches": job.writer.totals.get("batches", 0), "totals": dict(job.writer.totals)}))


if __name__ == "__main__":
    main()
