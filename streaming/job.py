"""The streaming job: Kafka -> per-device stateful cleaning and scoring -> sinks.

The same code runs in local mode (``iotwatch stream``) and under ``spark-submit`` on a
cluster (``python -m iotwatch.streaming.job`` as the application, master from spark-submit): the
scale-out path is Spark's -- Kafka partitions read in parallel by executors, state
sharded by device over ``shuffle_partitions`` -- not ours.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from iotwatch.clients.kafka import ensure_topics
from iotwatch.errors import IotwatchError
from iotwatch.jvm.spark import ARROW_UNCHECKED_ENV
from iotwatch.models.catalog import check_kernels
from iotwatch.settings import Settings, StreamSettings
from iotwatch.streaming.checkpoint import WAY_OUT, ResetTo, cluster_id, prepare_checkpoint, resolve_checkpoint
from iotwatch.streaming.ingestion_gap import GapAlertWriter, IngestionGaps
from iotwatch.streaming.worker_daemon import WORKER_ALLOCATOR_ENV

if TYPE_CHECKING:
    from iotwatch.streaming.progress import ProgressReporter

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Longest wait for a moment between micro-batches before a stop interrupts the one in
#: progress (the next start plans it again: :func:`prepare_checkpoint`).
STOP_WAIT_S = 5.0

#: Spark's status message while it plans a micro-batch, before the batch's offsets are logged.
PLANNING = "Getting offsets from"

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


#: Checkpoint files through Hadoop's FileSystem API rather than FileContext: on the local
#: file system (the job's checkpoint is a local path) FileContext's rename checks each
#: path's link status by forking ``readlink`` (Hadoop has no native library here): about
#: 30 processes started per micro-batch, 70 ms of every batch's WAL and offset commits.
#: FileSystem's rename is ``File.renameTo``, atomic on POSIX file systems.
CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"

#: The job's Spark settings: RocksDB state store (transformWithState needs it), committing
#: each micro-batch as a changelog of the keys it changed instead of a snapshot of the store.
STREAM_CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.noDataMicroBatches.enabled": "true",
    "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
    # Expressions run as generated code, but no whole-stage code generation. Every Kafka
    # record passes through the JVM (the connector's row, then Arrow for the packing step):
    # there, interpreted projections cost about a third of the reading and packing stage
    # (200,000 records: 3.3-3.6 s interpreted, 2.1-2.4 s generated). Whole-stage code for the
    # plan, re-generated every micro-batch, saved nothing more there.
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "FALLBACK",
    # One pool of Python workers for the whole job. Spark keeps a pool per worker environment,
    # and simplified tracebacks put a variable in the environment of SQL UDFs (the packing
    # step) that transformWithStateInPandas and RDD jobs do not have: two daemons, each with
    # its own workers that import the job and load its kernels on their first batch. The
    # setting only trims pyspark's own frames from a UDF's error.
    "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
    # Workers forked from a daemon that has loaded the job (:mod:`iotwatch.streaming.worker_daemon`).
    "spark.python.daemon.module": "iotwatch.streaming.worker_daemon",
    # Arrow batches of Kafka rows into the packing step: fewer round trips to the Python
    # worker per task (each batch is still held under ``maxBytesPerBatch``, 64 MB).
    "spark.sql.execution.arrow.maxRecordsPerBatch": "50000",
    **{f"spark.executorEnv.{name}": value for name, value in {**WORKER_ALLOCATOR_ENV, **ARROW_UNCHECKED_ENV}.items()},
}


def _session_options(settings: StreamSettings) -> dict[str, Any]:
    return {"shuffle_partitions": settings.shuffle_partitions, "conf": STREAM_CONF, "writes_class_data": True}


def spark_session(settings: StreamSettings, app_name: str = "iotwatch-stream") -> SparkSession:
    """A session for the job (the master is left to spark-submit when running under it)."""
    from iotwatch.jvm.spark import spark_session as session

    return session(app_name, settings.spark_master, **_session_options(settings))


def session_scope(settings: StreamSettings, app_name: str) -> AbstractContextManager[SparkSession]:
    """:func:`spark_session`, stopped (with its JVM) when the block ends."""
    from iotwatch.jvm.spark import session_scope as scope

    return scope(app_name, settings.spark_master, **_session_options(settings))


@dataclass
class RunningJob:
    spark: SparkSession
    query: StreamingQuery
    reporter: ProgressReporter

    @property
    def totals(self) -> Counter[str]:
        """Running totals of every micro-batch so far (see :mod:`iotwatch.streaming.progress`)."""
        return self.reporter.totals

    def caught_up(self) -> bool:
        """The backlog is processed: the query ended, or its last batch read nothing and no
        more data is waiting. (With state TTL and silence timers, Spark keeps running
        no-data batches even after an availableNow trigger has read everything.)"""
        if not self.query.isActive:
            return True
        progress = self.query.lastProgress
        return bool(
            progress
            and progress["batchId"] >= 0
            and progress["numInputRows"] == 0
            and not self.query.status["isDataAvailable"]
            and self.totals.get("batches", 0) > 0
        )

    def await_backlog(self, timeout_s: float) -> None:
        """Block until :meth:`caught_up` (or the query failed), then stop the query."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.caught_up():
            time.sleep(0.5)
        self.stop()

    def _last_batch(self) -> int:
        progress = self.query.lastProgress
        return -1 if progress is None else int(progress["batchId"])

    def _await_batch_end(self, deadline: float) -> None:
        """Until the micro-batch in progress has ended (or ``deadline``): best while the next
        one gets its offsets, before it logs them."""
        last, polls = self._last_batch(), 0
        while time.monotonic() < deadline:
            status = self.query.status
            if not status["isTriggerActive"] or status["message"].startswith(PLANNING):
                return
            polls += 1
            if polls % 10 == 0 and self._last_batch() != last:
                return  # that moment missed: the next micro-batch, barely begun, is interrupted
            time.sleep(0.005)

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop the query between micro-batches, if the one in progress ends within ``wait_s``:
        a stop interrupts a micro-batch, which Spark reports with stack traces, logged at DEBUG
        here, and the next start plans that batch again over all that came since. With
        no trigger interval the next micro-batch is planned at once: the stop comes while it
        gets its offsets, or, that moment missed, just after it began. Idempotent; tolerates
        a JVM already shutting down.

        The benchmarks stop at once: waiting for the end of a micro-batch there makes the
        next query's spike-to-alert latency worse (perhaps the stopped query's state stores
        stay loaded until Spark's maintenance unloads them)."""
        from iotwatch.jvm.spark import quiet_stop

        try:
            if wait_s > 0:
                self._await_batch_end(time.monotonic() + wait_s)
            with quiet_stop():
                self.query.stop()
            self.reporter.close()
        except Exception as exc:
            log.warning("stopping the query: %s", str(exc).splitlines()[0])


def start(
    spark: SparkSession,
    settings: Settings,
    *,
    checkpoint_dir: Path | None = None,
    archive_dir: Path | None = None,
    available_now: bool = False,
    query_name: str = "iotwatch_stream",
    warm_up: bool = False,
    gaps: IngestionGaps | None = None,
) -> RunningJob:
    """Start the query; offsets and state are kept in ``checkpoint_dir``; ``gaps``: where
    the input's gaps are judged (:mod:`iotwatch.streaming.ingestion_gap`). With ``warm_up``,
    synthetic readings go through the job's operator first
    (:mod:`iotwatch.streaming.warm_up`), so the first micro-batch on Kafka runs warm
    (:func:`run_job` asks for it only when no records are waiting, which the first
    micro-batch would otherwise read at once)."""
    from iotwatch.streaming.kafka_source import read_kafka_stream
    from iotwatch.streaming.operator_query import start_operator
    from iotwatch.streaming.progress import ProgressReporter

    stream = settings.stream
    check_kernels(stream.detector_names())  # here, not in a task
    checkpoint = resolve_checkpoint(settings, checkpoint_dir)
    archive = str(Path(archive_dir or stream.archive_dir).expanduser().resolve())
    tasks = int(spark.conf.get("spark.sql.shuffle.partitions") or 200)  # the stateful operator's, spark-submit's too
    warm_python_workers(spark)
    packed = read_kafka_stream(
        spark,
        settings.kafka,
        [settings.topics.raw],
        starting_offsets=stream.starting_offsets,
        max_offsets_per_trigger=stream.max_offsets_per_trigger,
        packed=True,
        operator_tasks=tasks,
        pattern=settings.topics.raw_pattern,
    )
    reporter = ProgressReporter(settings, query_name, gaps)
    log.info(
        "streaming %s from %s; checkpoint %s; archive %s",
        f"topics matching {settings.topics.raw_pattern}" if settings.topics.raw_pattern else settings.topics.raw,
        settings.kafka.bootstrap_servers,
        checkpoint,
        archive,
    )
    if warm_up:
        from iotwatch.streaming.warm_up import run_warm_up

        run_warm_up(spark, settings, tasks)
    query = start_operator(packed, settings, archive, checkpoint, query_name, available_now)
    reporter.follow(query)
    return RunningJob(spark, query, reporter)


def _warm_worker(_: object) -> None:
    """In a Python worker: import the job's modules and load its compiled kernels (already
    done when the worker was forked from :mod:`iotwatch.streaming.worker_daemon`)."""
    from iotwatch.streaming.worker_daemon import load_job

    load_job()


def warm_python_workers(spark: SparkSession) -> threading.Thread:
    """Start the executors' Python workers and load the job's modules and compiled kernels
    while the query is defined and plans its first micro-batch, in a background job: workers
    are reused, so the first batch finds them ready instead of paying their start-up."""
    slots = max(1, spark.sparkContext.defaultParallelism)

    def run() -> None:
        try:
            spark.sparkContext.parallelize(range(slots), slots).foreach(_warm_worker)
        except Exception as exc:
            log.debug("warming Python workers: %s", str(exc).splitlines()[0])

    thread = threading.Thread(target=run, name="warm-python-workers", daemon=True)
    thread.start()
    return thread


#: Seconds between a failed query and its restart.
RESTART_BACKOFF_S = 2.0


class StreamingQueryFailed(IotwatchError):
    """The streaming query stopped with an error (its root cause, and what to do if known)."""


def root_cause(text: str) -> str:
    """The most telling line of a Spark/py4j error: the last Python exception line, or the first."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception|Violation)\b.*:", line)]
    return (raised[-1] if raised else lines[0] if lines else "unknown error")[:500]


def prepare_outputs(settings: Settings) -> None:
    """Create missing topics and the InfluxDB database."""
    from iotwatch.clients.influx import InfluxV1Client

    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    if settings.influx.enabled:
        client = InfluxV1Client(settings.influx)
        client.create_database()
        client.close()
    else:
        log.warning("InfluxDB disabled: aggregates and pipeline health are not written")


def _prepare(
    settings: Settings, checkpoint_dir: Path | None, reset_offsets: ResetTo | None, warm_up: bool
) -> tuple[Path, bool]:
    """The query's modules loaded, the topics and InfluxDB database made, the checkpoint
    checked against Kafka and an interrupted micro-batch's offsets dropped
    (:func:`prepare_checkpoint`): the checkpoint's folder, and whether
    ``warm_up`` still holds (no records are waiting, as after a restart: see :func:`start`)."""
    # the query's modules (pandas and InfluxDB's client among theirs: seconds on a busy machine)
    from iotwatch.streaming import kafka_source, operator_query  # noqa: F401

    prepare_outputs(settings)
    checkpoint = resolve_checkpoint(settings, checkpoint_dir)
    prepare_checkpoint(settings, checkpoint, cluster_id(settings), reset_offsets)
    if warm_up and not reset_offsets:
        from iotwatch.streaming.warm_up import records_waiting

        if waiting := records_waiting(settings, checkpoint):
            log.info("no warm-up micro-batch: %d records are waiting for the job", waiting)
            warm_up = False
    return checkpoint, warm_up


def _in_daemon_thread(call: Callable[[], T], name: str) -> Future[T]:
    """``call()`` in a daemon thread: a process that gives up meanwhile does not wait for it."""
    done: Future[T] = Future()

    def run() -> None:
        try:
            done.set_result(call())
        except BaseException as exc:
            done.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return done


def run_job(
    settings: Settings,
    checkpoint_dir: Path | None,
    archive_dir: Path | None,
    *,
    available_now: bool,
    duration: float | None,
    query_name: str = "iotwatch_stream",
    warm_up: bool = False,
    reset_offsets: ResetTo | None = None,
    step: Callable[[str | None], None] | None = None,
) -> RunningJob:
    """Run the job until Ctrl-C/SIGTERM, ``duration``, or (``available_now``) the backlog is done
    (``iotwatch stream``, ``iotwatch replay`` and spark-submit's :func:`main`); a failed query
    raises :class:`StreamingQueryFailed` with its root cause. ``warm_up``: a warm-up
    micro-batch before the first start (:mod:`iotwatch.streaming.warm_up`; local mode only,
    where its source file is readable by the executor, and not with ``available_now``).
    A checkpoint Kafka no longer has the offsets of is refused before the query starts, unless
    ``reset_offsets`` sets it aside (:mod:`iotwatch.streaming.checkpoint`). ``step``: told
    what the job is doing until its first micro-batch ran (then None)."""
    step = step or (lambda _text: None)
    stop = threading.Event()
    _stop_on_signals(stop)
    step("creating topics and starting Spark")
    # Spark starts beside the query's imports and Kafka's checks (seconds each): a restart pays the longer
    with ExitStack() as scope:
        session = session_scope(settings.stream, "iotwatch-stream")
        spark_started = _in_daemon_thread(session.__enter__, "spark-start")
        try:
            # a refusal (Kafka's, the checkpoint's) says what to fix at once, not once Spark is up
            checkpoint_dir, warm_up = _prepare(settings, checkpoint_dir, reset_offsets, warm_up and not available_now)
        except BaseException:
            spark_started.add_done_callback(lambda started: started.exception() or session.__exit__(None, None, None))
            raise
        spark = spark_started.result()
        scope.push(session.__exit__)
        if reset_offsets:
            settings = settings.model_copy(
                update={"stream": settings.stream.model_copy(update={"starting_offsets": reset_offsets})}
            )
        started = time.monotonic()
        restarts = 0
        earlier: Counter[str] = Counter()
        local = (spark.sparkContext.master or "").startswith("local")
        writer = None if available_now else GapAlertWriter(settings)
        gaps = None if writer is None else IngestionGaps(settings, writer)
        while True:
            step("planning the query" + (" and a warm-up micro-batch" if warm_up and not restarts else ""))
            job = start(
                spark,
                settings,
                checkpoint_dir=checkpoint_dir,
                archive_dir=archive_dir,
                available_now=available_now,
                query_name=query_name,
                warm_up=warm_up and not restarts and not available_now and local,
                gaps=gaps,
            )
            if restarts:
                job.reporter.totals.update(earlier)
            step("waiting for the first micro-batch")
            exception = _serve(job, stop, started, duration, available_now, step)
            if exception is None or stop.is_set() or not _restartable(str(exception)):
                break
            if restarts >= settings.stream.query_restarts:
                log.error("the query failed %d times; giving up", restarts + 1)
                break
            restarts += 1
            earlier = job.totals
            log.warning(
                "streaming query failed (%s); starting it again from its checkpoint (restart %d of %d)",
                root_cause(str(exception)),
                restarts,
                settings.stream.query_restarts,
            )
            if stop.wait(RESTART_BACKOFF_S):
                break
        if writer is not None:
            writer.close()
    if exception is not None:
        raise StreamingQueryFailed(f"streaming query failed: {root_cause(str(exception))}{_hint(str(exception))}")
    return job


def _serve(
    job: RunningJob,
    stop: threading.Event,
    started: float,
    duration: float | None,
    available_now: bool,
    step: Callable[[str | None], None],
) -> Exception | None:
    """Let the query run until a stop, ``duration``, the backlog's end or its failure; then
    stop it (the micro-batch in progress finishes) and return its exception, if any."""
    try:
        first = True
        while job.query.isActive and not stop.is_set():
            if first and job.totals.get("batches", 0):
                step(None)
                first = False
            if duration is not None and time.monotonic() - started >= duration:
                break
            if available_now and job.caught_up():
                break
            stop.wait(0.5)
        return job.query.exception()
    finally:
        if stop.is_set():
            log.info("stopping: waiting up to %.0f s for the micro-batch in progress", STOP_WAIT_S)
        job.stop(STOP_WAIT_S)


def _restartable(error: str) -> bool:
    """A failure that starting again from the checkpoint can get past: not one the user must
    fix first (a checkpoint of another state layout, or offsets Kafka no longer has, fail the
    same way every time)."""
    return not any(name in error for name in (*_STATE_LAYOUT_ERRORS, DATA_LOST))


def _stop_on_signals(stop: threading.Event) -> None:
    """Ctrl-C and SIGTERM set ``stop``: the query then ends between micro-batches, with totals."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())


#: Spark's words for a checkpoint whose offsets the Kafka cluster no longer has.
DATA_LOST = "Some data may have been lost"
#: Spark's error classes for a checkpoint whose state another version of iotwatch laid out otherwise.
_STATE_LAYOUT_ERRORS = ("STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE")


def _hint(error: str) -> str:
    """What to do about a failure a user can fix, appended to its message."""
    if any(name in error for name in _STATE_LAYOUT_ERRORS):
        return (
            " -- the checkpoint was written by an earlier iotwatch with another state layout: "
            "start with a new --checkpoint directory (with --starting-offsets earliest it reprocesses the topic)"
        )
    if DATA_LOST in error:
        return f" -- the checkpoint's offsets are no longer in Kafka: {WAY_OUT}"
    return ""


def main(argv: list[str] | None = None) -> None:
    """Entry point for spark-submit (``spark-submit --master spark://… streaming/job.py``):
    settings from IOTWATCH_* and IOTWATCH_CONFIG, the master and resources from spark-submit.
    Runs like ``iotwatch stream``: until SIGTERM, ``--duration``, or with ``--available-now``
    until the backlog is processed; then prints the totals as JSON."""
    import argparse
    import json

    from iotwatch.settings import load_settings

    parser = argparse.ArgumentParser(prog="streaming/job.py", description=main.__doc__)
    parser.add_argument("--available-now", action="store_true", help="process what is in Kafka now, then stop")
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        job = run_job(load_settings(), None, None, available_now=args.available_now, duration=args.duration)
    except StreamingQueryFailed as exc:
        raise SystemExit(f"iotwatch stream: {exc}") from exc
    print(json.dumps({"batches": job.totals.get("batches", 0), "totals": dict(job.totals)}))


if __name__ == "__main__":
    main()
