"""A Kafka source for Spark Structured Streaming written with the Python Data Source API.

Why it exists: Spark's own Kafka connector is a Maven jar (``spark-sql-kafka-0-10``)
that cannot be installed where iotwatch is developed and tested, and PySpark ships
none. This source reads Kafka with confluent-kafka and behaves like the connector:
same columns, same option names (``kafka.*``, ``subscribe``, ``startingOffsets``,
``maxOffsetsPerTrigger``, ``minPartitions``, ``failOnDataLoss``; plus ``maxPartitions``, and
``layout``, ``chunkRows`` and ``operatorTasks`` for the job's packed rows), offsets kept in
Spark's checkpoint as ``{topic: {"partition": next_offset}}``. Deployments that do
have the jar choose it with ``read_kafka_stream(..., source="spark")``.

Layout: the driver keeps one long-lived :class:`KafkaStreamReader` (Spark runs it in a
Python process for the life of the query) that plans offset ranges with
:class:`~streaming.kafka_offsets.OffsetClient`; each range becomes one
:class:`KafkaRange` task (or ranges are grouped into ``maxPartitions`` tasks) whose
``read()`` runs on an executor with its own consumer, built from the options alone, so
the same code runs under ``spark-submit`` on a cluster.
"""

from __future__ import annotations

import atexit
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streaming.kafka_offsets import (
    EARLIEST,
    LATEST,
    TP,
    KafkaDataLossError,
    OffsetClient,
    client_config,
    fair_share,
    from_json,
    group_ranges,
    parse_offsets_option,
    split_ranges,
    to_json,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from iotwatch.settings import KafkaSettings

log = logging.getLogger(__name__)

FORMAT = "iotwatch-kafka"
# Built explicitly: parsing a DDL string needs a JVM, absent at import on executors.
SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers", ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
        ),
    ]
)
# Exactly the Arrow schema Spark checks yielded batches against.
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")
_HEADERS_TYPE = ARROW_SCHEMA.field("headers").type
# librdkafka timestamp type (0 none, 1 create, 2 log append) -> Kafka's TimestampType id.
_TS_TYPE = {0: -1, 1: 0, 2: 1}


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """Records ``[start, end)`` of one Kafka partition: one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class KafkaRanges(InputPartition):
    """Several ranges read one after another by one task (option ``maxPartitions``)."""

    ranges: tuple[KafkaRange, ...]


@dataclass(frozen=True)
class ReadOptions:
    """What an executor needs to read a range: only option values, so it pickles."""

    config: dict[str, str]
    fail_on_data_loss: bool = True
    poll_timeout_s: float = 120.0
    chunk_rows: int = 10_000
    packed: bool = False  # layout=packed: decoded chunks (streaming.schemas.PACKED_SCHEMA)
    operator_tasks: int = 1  # packed: keyed for a stateful operator of this many tasks

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        opts = {k.lower(): v for k, v in options.items()}
        return cls(
            config=client_config(opts),
            fail_on_data_loss=opts.get("failondataloss", "true").lower() != "false",
            poll_timeout_s=int(opts.get("kafkaconsumer.polltimeoutms", "120000")) / 1000,
            chunk_rows=int(opts.get("chunkrows", "10000")),
            packed=opts.get("layout", "records").lower() == "packed",
            operator_tasks=int(opts.get("operatortasks", "1")),
        )


def _batch(topic: str, partition: int, rows: list[Any]) -> pa.RecordBatch:
    keys, values, offsets, stamps, kinds, headers = [], [], [], [], [], []
    for msg in rows:
        keys.append(msg.key())
        values.append(msg.value())
        offsets.append(msg.offset())
        kind, ms = msg.timestamp()
        stamps.append(ms * 1000)
        kinds.append(_TS_TYPE.get(kind, -1))
        hdrs = msg.headers()
        headers.append([{"key": k, "value": v} for k, v in hdrs] if hdrs else None)
    n = len(rows)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(stamps, ARROW_SCHEMA.field("timestamp").type),
            pa.array(kinds, pa.int32()),
            pa.array(headers, _HEADERS_TYPE),
        ],
        schema=ARROW_SCHEMA,
    )


def _chunk(opts: ReadOptions, part: KafkaRange, rows: list[Any]) -> pa.RecordBatch:
    """Records in the connector's columns, or decoded and packed (the streaming job's layout)."""
    if not opts.packed:
        return _batch(part.topic, part.partition, rows)
    from streaming.packing import pack_messages

    return pack_messages(part.partition, rows, opts.operator_tasks)


@dataclass
class _Cached:
    """A consumer kept in a Python worker between tasks, unassigned while idle."""

    consumer: Any
    used_at: float = field(default_factory=time.monotonic)


class ConsumerCache:
    """A consumer kept per client configuration in a Python worker between tasks, as Spark's
    own Kafka connector keeps them per executor (``spark.kafka.consumer.cache.capacity``).

    Creating a consumer costs a connection and metadata on every range: with micro-batches a
    fraction of a second apart that is a large share of a batch. A cached consumer keeps its
    connection but is unassigned between ranges and assigned at each range's start (any
    topic and partition: a task's ranges are read one after another), so an idle
    consumer sends no fetches, so none is parked at the broker when the next range's records
    are already there. (Measured against the embedded broker, which holds a fetch for most
    of ``fetch.wait.max.ms`` even when records are waiting: a consumer that kept fetching
    between ranges, or was paused and resumed, delivered a range's first record 200-400 ms
    after the task asked for it; a fresh assign, within a few milliseconds.) Dropped on any
    error or after a minute unused. Spark runs one task at a time per worker.
    """

    CAPACITY = 16
    IDLE_S = 60.0
    #: Prefetch queue per cached consumer (librdkafka's default is 64 MiB).
    QUEUE_KBYTES = "16384"
    #: A read task asks only for records the driver saw on the broker, so a fetch never has
    #: to wait for data: the embedded broker answers after this wait even when it has
    #: records (librdkafka's default of 500 ms cost up to 250 ms per fetch there).
    FETCH_WAIT_MS = "10"

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], _Cached] = {}

    def take(self, opts: ReadOptions, part: KafkaRange, reset: str) -> tuple[tuple[Any, ...], _Cached]:
        """A consumer assigned to ``part``'s partition at its start offset."""
        from confluent_kafka import Consumer, TopicPartition

        key = (tuple(sorted(opts.config.items())), reset)
        cached = self._entries.pop(key, None)
        if cached is None:
            from iotwatch.logs import librdkafka_logger

            consumer = Consumer(
                {
                    "queued.max.messages.kbytes": self.QUEUE_KBYTES,
                    "fetch.wait.max.ms": self.FETCH_WAIT_MS,
                    **opts.config,
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "auto.offset.reset": reset,
                    "logger": librdkafka_logger(),
                }
            )
            cached = _Cached(consumer)
        cached.consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
        return key, cached

    def give_back(self, key: tuple[Any, ...], cached: _Cached) -> None:
        """Keep ``cached`` (unassigned: it stops fetching) for the next range."""
        cached.consumer.unassign()
        cached.used_at = now = time.monotonic()
        self._entries[key] = cached
        for old in [k for k, c in self._entries.items() if now - c.used_at > self.IDLE_S]:
            _close(self._entries.pop(old).consumer)
        while len(self._entries) > self.CAPACITY:
            _close(self._entries.pop(next(iter(self._entries))).consumer)

    def close(self) -> None:
        """Close every cached consumer (tests, a worker shutting down)."""
        while self._entries:
            _close(self._entries.popitem()[1].consumer)


def _close(consumer: Any) -> None:
    try:
        consumer.close()
    except Exception:
        pass


_CONSUMERS = ConsumerCache()
atexit.register(_CONSUMERS.close)


def read_range(opts: ReadOptions, part: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``part`` as Arrow batches of ``opts.chunk_rows``.

    assign() + the exact start offset (no group, no commit), with a consumer of the
    worker's :class:`ConsumerCache`. Stops at the first record at or past ``end``, or at
    ``_PARTITION_EOF`` at/after ``end`` (offsets in between that never arrive are
    transaction markers or compacted away). If nothing moves for
    ``poll_timeout_s`` it raises instead of hanging a task forever.
    """
    from confluent_kafka import KafkaError, KafkaException

    from streaming.worker_heap import freeze_imports

    reset = "earliest" if not opts.fail_on_data_loss else "error"
    key, cached = _CONSUMERS.take(opts, part, reset)
    consumer = cached.consumer
    where = f"{part.topic}-{part.partition} [{part.start}, {part.end})"
    try:
        position, rows = part.start, []
        last_progress = time.monotonic()
        while position < part.end:
            progressed = False  # a record or an end-of-log answer; error events are not progress
            batch = consumer.consume(min(opts.chunk_rows, part.end - position), 0.5)
            for msg in batch:
                err = msg.error()
                progressed = progressed or err is None or err.code() == KafkaError._PARTITION_EOF
                if err is None:
                    offset = msg.offset()
                    if offset >= part.end:
                        position = part.end
                        break
                    if offset < position:
                        continue
                    if offset > part.start and position == part.start and not opts.fail_on_data_loss:
                        log.warning(
                            "%s: records from %d to %d are gone from the broker; skipped (failOnDataLoss=false)",
                            where,
                            part.start,
                            offset,
                        )
                    rows.append(msg)
                    position = offset + 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    if msg.offset() >= part.end:
                        position = part.end
                        break
                elif err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    raise KafkaDataLossError(
                        f"{where}: offset {position} is no longer available on the broker ({err.str()}): "
                        "records were deleted by retention or the topic was re-created. Set "
                        "failOnDataLoss=false to skip them, or restart with a fresh checkpoint."
                    )
                elif err.fatal() or not err.retriable():
                    raise KafkaException(err)
                else:
                    log.warning("%s: %s (retrying)", where, err)
            if progressed:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > opts.poll_timeout_s:
                if not opts.fail_on_data_loss:
                    log.warning(
                        "%s: nothing after offset %d for %.0fs; ending the range early (failOnDataLoss=false)",
                        where,
                        position,
                        opts.poll_timeout_s,
                    )
                    break
                raise TimeoutError(
                    f"{where}: no record after offset {position} within {opts.poll_timeout_s:.0f}s "
                    "(kafkaConsumer.pollTimeoutMs): the broker is unreachable or lost records it "
                    "reported before"
                )
            if len(rows) >= opts.chunk_rows:
                yield _chunk(opts, part, rows)
                rows = []
        if rows:
            yield _chunk(opts, part, rows)
    except BaseException:
        _close(consumer)
        raise
    _CONSUMERS.give_back(key, cached)
    freeze_imports()  # the first range has loaded everything a read needs


def read_task(opts: ReadOptions, task: InputPartition) -> Iterator[pa.RecordBatch]:
    """The records of one read task: a range, or a group of ranges in turn."""
    if isinstance(task, KafkaRanges):
        for part in task.ranges:
            yield from read_range(opts, part)
    elif isinstance(task, KafkaRange):
        yield from read_range(opts, task)
    else:
        raise TypeError(f"not a Kafka read task: {task!r}")


class _Planner:
    """Offset planning shared by the streaming and the batch reader (driver side)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        self.read_options = ReadOptions.parse(opts)
        if "subscribe" not in opts:
            raise ValueError(
                "option 'subscribe' (comma-separated topics) is required; subscribePattern and assign are not supported"
            )
        self.topics = [t.strip() for t in opts["subscribe"].split(",") if t.strip()]
        min_parts, max_parts = opts.get("minpartitions"), opts.get("maxpartitions")
        self.min_partitions = int(min_parts) if min_parts else None
        self.max_partitions = int(max_parts) if max_parts else None
        self.client = OffsetClient(
            self.read_options.config, probe_timeout_s=int(opts.get("logendprobetimeoutms", "2000")) / 1000
        )
        self.lows: dict[TP, int] = {}

    def resolve(self, spec: str | dict[TP, int]) -> dict[TP, int]:
        """Concrete offsets for every current partition: earliest, latest, or per-partition JSON
        (-2/-1 markers resolved; partitions the JSON leaves out start at earliest)."""
        tps = self.client.partitions(self.topics)
        self.lows, ends = self.client.log_ends(tps)
        resolved = {}
        for tp in tps:
            wanted = spec.get(tp, EARLIEST) if isinstance(spec, dict) else (LATEST if spec == "latest" else EARLIEST)
            resolved[tp] = ends[tp] if wanted == LATEST else self.lows[tp] if wanted == EARLIEST else wanted
        return resolved

    def tasks(self, start: Mapping[TP, int], end: Mapping[TP, int]) -> list[InputPartition]:
        """The read tasks: :meth:`ranges`, grouped into ``maxPartitions`` tasks at most."""
        groups = group_ranges(
            [(r.topic, r.partition, r.start, r.end) for r in self.ranges(start, end)], self.max_partitions
        )
        return [KafkaRange(*g[0]) if len(g) == 1 else KafkaRanges(tuple(KafkaRange(*r) for r in g)) for g in groups]

    def ranges(self, start: Mapping[TP, int], end: Mapping[TP, int]) -> list[KafkaRange]:
        """One range per partition that moved (split further for ``minPartitions``)."""
        if any(tp not in start or tp not in self.lows for tp in end):  # e.g. a batch replayed after restart
            self.lows.update({tp: low for tp, (low, _) in self.client.watermarks(end).items()})
        found = []
        for tp, until in sorted(end.items()):
            low = self.lows.get(tp, 0)
            since = start.get(tp, low)  # a partition new since the last batch starts at earliest
            if since < low or since > until:
                problem = (
                    f"{tp[0]}-{tp[1]}: offsets {since}..{min(low, until)} are gone from the broker"
                    if since < low
                    else f"{tp[0]}-{tp[1]}: the log end went back from {since} to {until} (topic re-created?)"
                )
                if self.read_options.fail_on_data_loss:
                    raise KafkaDataLossError(
                        problem + ". Set failOnDataLoss=false to skip, or restart the query with a fresh checkpoint."
                    )
                log.warning("%s; reading from the earliest offset %d instead (failOnDataLoss=false)", problem, low)
                since = low
            if until > since:
                found.append((tp[0], tp[1], since, until))
        return [KafkaRange(*r) for r in split_ranges(found, self.min_partitions)]


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch planning on the driver; ``read()`` on executors."""

    def __init__(self, options: Mapping[str, str]) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        self._plan = _Planner(opts)
        self._starting = parse_offsets_option(opts.get("startingoffsets"), "latest")
        limit = opts.get("maxoffsetspertrigger")
        self._max_rows = int(limit) if limit else None
        self._target: dict[TP, int] | None = None  # Trigger.AvailableNow: stop here
        self._latest: dict[TP, int] = {}

    def initialOffset(self) -> dict:
        """Resolved to concrete numbers now, so the checkpoint never holds -1/-2."""
        return to_json(self._plan.resolve(self._starting))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self._max_rows) if self._max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._plan.resolve("latest")

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The log ends (capped by the AvailableNow target), then ``limit`` shared fairly
        over the partitions that have a backlog. Partitions new since ``start`` count
        from their earliest offset."""
        begin = from_json(start)
        tps = self._plan.client.partitions(self._plan.topics)
        lows, ends = self._plan.client.log_ends(tps, floor=begin)
        self._plan.lows.update(lows)
        self._latest = dict(ends)
        end = dict(ends)  # below a start only if a fetch proved it: partitions() reports that
        if self._target is not None:
            # The target may be an unconfirmed (short) answer: never let it pull an end below the start.
            end = {tp: min(n, max(self._target[tp], begin.get(tp, 0))) for tp, n in end.items() if tp in self._target}
        for tp, offset in begin.items():  # partitions that vanished keep their position
            end.setdefault(tp, offset)
        if isinstance(limit, ReadMaxRows):
            since = {tp: max(begin.get(tp, lows.get(tp, 0)), lows.get(tp, 0)) for tp in end}
            backlog = {tp: max(0, end[tp] - since[tp]) for tp in end}
            share = fair_share(backlog, limit.max_rows)
            end = {tp: since[tp] + share[tp] if backlog[tp] else end[tp] for tp in end}
        return to_json(end)

    def reportLatestOffset(self) -> dict | None:
        return to_json(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return self._plan.tasks(from_json(start), from_json(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_task(self._plan.read_options, partition)

    def commit(self, end: dict) -> None:
        """Offsets live in Spark's checkpoint; nothing is committed to Kafka."""

    def stop(self) -> None:
        self._plan.client.close()


class KafkaBatchReader(DataSourceReader):
    """``spark.read``: ``startingOffsets`` (default earliest) to ``endingOffsets`` (default latest)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        plan = _Planner(opts)
        try:
            start = plan.resolve(parse_offsets_option(opts.get("startingoffsets"), "earliest"))
            end = plan.resolve(parse_offsets_option(opts.get("endingoffsets"), "latest"))
            self._ranges = plan.tasks(start, end)
        finally:
            plan.client.close()
        self._read_options = plan.read_options

    def partitions(self) -> list[InputPartition]:
        return list(self._ranges) or [KafkaRange("", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, KafkaRange) and partition.end <= partition.start:
            return iter(())
        return read_task(self._read_options, partition)


class KafkaDataSource(DataSource):
    """Registered as format ``iotwatch-kafka`` by ``spark.dataSource.register(KafkaDataSource)``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        if self.options.get("layout", "records").lower() == "packed":
            from streaming.schemas import PACKED_SCHEMA

            return PACKED_SCHEMA
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(self.options)


def kafka_options(settings: KafkaSettings, source: Literal["python", "spark"]) -> dict[str, str]:
    """Connection options for either source. librdkafka and the Java client spell
    credentials differently (``sasl.username`` vs a JAAS line, a CA file vs a PEM truststore)."""
    if source == "python":
        return {f"kafka.{k}": v for k, v in settings.client_config().items()}
    opts = {
        "kafka.bootstrap.servers": settings.bootstrap_servers,
        "kafka.security.protocol": settings.security_protocol,
    }
    if settings.sasl_mechanism:
        opts["kafka.sasl.mechanism"] = settings.sasl_mechanism
        module = "plain.PlainLoginModule" if settings.sasl_mechanism.upper() == "PLAIN" else "scram.ScramLoginModule"
        password = settings.sasl_password.get_secret_value() if settings.sasl_password else ""
        opts["kafka.sasl.jaas.config"] = (
            f"org.apache.kafka.common.security.{module} required "
            f'username="{settings.sasl_username or ""}" password="{password}";'
        )
    if settings.ssl_ca_location:
        opts["kafka.ssl.truststore.type"] = "PEM"
        opts["kafka.ssl.truststore.location"] = str(settings.ssl_ca_location)
    return opts


#: Session setting that marks the source as registered in this Spark session.
_REGISTERED = "iotwatch.kafkaSource.registered"


def _register(spark: SparkSession, source: str) -> str:
    if source == "spark":
        return "kafka"
    if source != "python":
        raise ValueError(f"source must be 'python' or 'spark', not {source!r}")
    if spark.conf.get(_REGISTERED, "false") != "true":  # again would log a warning per query
        spark.dataSource.register(KafkaDataSource)
        spark.conf.set(_REGISTERED, "true")
    return FORMAT


def read_kafka_stream(
    spark: SparkSession,
    settings: KafkaSettings,
    topics: list[str],
    *,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    source: Literal["python", "spark"] = "python",
    packed: bool = False,
    operator_tasks: int = 1,
) -> DataFrame:
    """A streaming DataFrame of ``topics`` with the Kafka connector's columns (headers included),
    or with ``packed`` the telemetry decoded and packed in chunks
    (:data:`streaming.schemas.PACKED_SCHEMA`), keyed for a stateful operator of
    ``operator_tasks`` tasks (:mod:`streaming.operator_key`).

    ``source="spark"`` uses Spark's connector (the jar must be on the classpath, as in
    docker-compose); ``"python"`` this module's source, which decodes and packs as it reads
    (no second pass through a Python worker). Offsets checkpoint the same way.
    """
    reader = (
        spark.readStream.format(_register(spark, source))
        .options(**kafka_options(settings, source))
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", starting_offsets)
        .option("includeHeaders", "true")
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    if packed and source == "python":
        # one read task per core: with more Kafka partitions than cores, tasks in waves
        # would each pay a task's set-up in every micro-batch
        return (
            reader.option("layout", "packed")
            .option("chunkRows", "20000")
            .option("operatorTasks", str(operator_tasks))
            .option("maxPartitions", str(spark.sparkContext.defaultParallelism))
            .load()
        )
    frame = reader.load()
    if not packed:
        return frame
    from functools import partial

    from streaming.packing import pack_records
    from streaming.schemas import PACKED_SCHEMA

    return frame.select("key", "value", "partition", "offset", "timestamp").mapInArrow(
        partial(pack_records, tasks=operator_tasks), PACKED_SCHEMA
    )


def read_kafka_batch(
    spark: SparkSession,
    settings: KafkaSettings,
    topics: list[str],
    *,
    starting_offsets: str = "earliest",
    ending_offsets: str = "latest",
    source: Literal["python", "spark"] = "python",
) -> DataFrame:
    """The records of ``topics`` between two offsets as a batch DataFrame (e.g. for replay)."""
    return (
        spark.read.format(_register(spark, source))
        .options(**kafka_options(settings, source))
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", starting_offsets)
        .option("endingOffsets", ending_offsets)
        .option("includeHeaders", "true")
        .load()
    )
