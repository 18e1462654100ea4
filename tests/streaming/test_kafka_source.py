"""The ``iotwatch-kafka`` Spark source against the real embedded broker (Tansu) and a real
local[2] Spark: every record exactly once, limits per trigger, restart from checkpoint,
starting offsets, topics that appear later, and the Tansu ListOffsets quirk."""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from iotwatch.clients.kafka import ensure_topics
from iotwatch.settings import KafkaSettings, Settings
from streaming.kafka_offsets import (
    KafkaDataLossError,
    OffsetClient,
    fair_share,
    group_ranges,
    parse_offsets_option,
    split_ranges,
)
from streaming.kafka_source import (
    _CONSUMERS,
    KafkaDataSource,
    KafkaRange,
    KafkaStreamReader,
    ReadOptions,
    _Planner,
    kafka_options,
    read_kafka_batch,
    read_kafka_stream,
    read_range,
)

BASE_TS = 1_700_000_000_000


# --------------------------------------------------------------------------- helpers


def produce(
    kafka: KafkaSettings, topic: str, count: int, *, partitions: int = 4, first: int = 0, linger_ms: int = 20
) -> None:
    """``count`` records round-robin over partitions, with key, headers and a create time.
    linger makes the producer put many records in one batch (the Tansu quirk)."""
    producer = Producer({**kafka.client_config(), "linger.ms": linger_ms, "batch.num.messages": 100_000})
    for i in range(first, first + count):
        producer.produce(
            topic,
            value=b"v%d" % i,
            key=b"k%d" % i,
            partition=i % partitions,
            headers=[("seq", str(i).encode()), ("src", b"test")] if i % 3 else None,
            timestamp=BASE_TS + i,
        )
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


def new_topic(settings: Settings, unique: str, name: str = "t") -> str:
    topic = f"test.{unique}.{name}"
    ensure_topics(settings.kafka, [topic])
    return topic


class Collector:
    """foreachBatch sink keeping rows per batch id: a replayed batch must be identical."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple]] = {}

    def __call__(self, df, batch_id: int) -> None:
        rows = sorted(tuple(r) for r in df.select("topic", "partition", "offset", "value").collect())
        if batch_id in self.batches:
            assert self.batches[batch_id] == rows, f"batch {batch_id} replayed with different records"
        self.batches[batch_id] = rows

    def rows(self) -> list[tuple]:
        return [row for rows in self.batches.values() for row in rows]

    def values(self) -> list[bytes]:
        return sorted(bytes(r[3]) for r in self.rows())


def assert_exactly(collector: Collector, expected: range) -> None:
    rows = collector.rows()
    assert len({(t, p, o) for t, p, o, _ in rows}) == len(rows), "a record was read twice"
    assert collector.values() == sorted(b"v%d" % i for i in expected)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def run_stream(spark, stack_settings: Settings, tmp_path: Path) -> Callable:
    """Start a query of the python source into a Collector; returns (query, collector)."""
    started = []

    def start(
        topics: list[str],
        collector: Collector | None = None,
        *,
        checkpoint: str = "ck",
        trigger: dict | None = None,
        **kwargs,
    ):
        collector = collector or Collector()
        df = read_kafka_stream(spark, stack_settings.kafka, topics, **kwargs)
        query = (
            df.writeStream.foreachBatch(collector)
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .trigger(**(trigger or {"processingTime": "200 milliseconds"}))
            .start()
        )
        started.append(query)
        return query, collector

    yield start
    for query in started:
        if query.isActive:
            query.stop()


# --------------------------------------------------------------------------- no Spark


def test_fair_share_is_exact_and_never_starves() -> None:
    backlog = {("t", 0): 1_000_000, ("t", 1): 1_000_000, ("t", 2): 3, ("t", 3): 0}
    share = fair_share(backlog, 100)
    assert sum(share.values()) == 100
    assert share[("t", 2)] == 3 and share[("t", 3)] == 0
    assert fair_share(backlog, 10**9) == backlog
    assert sum(fair_share({("t", i): 10 for i in range(4)}, 2).values()) == 2


def test_split_ranges_for_min_partitions() -> None:
    ranges = [("t", 0, 0, 900), ("t", 1, 50, 150)]
    split = split_ranges(ranges, 10)
    assert len(split) == 10
    assert sorted(split) == sorted(set(split))
    assert sum(e - s for _, _, s, e in split) == 1000
    assert split_ranges(ranges, None) == ranges


def test_offsets_option_parsing() -> None:
    assert parse_offsets_option(None, "latest") == "latest"
    assert parse_offsets_option('{"a":{"0":23,"1":-2}}', "latest") == {("a", 0): 23, ("a", 1): -2}
    with pytest.raises(ValueError, match="earliest, latest or JSON"):
        parse_offsets_option("yesterday", "latest")


def test_data_loss_is_reported_or_skipped() -> None:
    options = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    strict = _Planner(options)
    strict.lows = {("t", 0): 100}
    with pytest.raises(KafkaDataLossError, match="failOnDataLoss=false"):
        strict.ranges({("t", 0): 40}, {("t", 0): 150})
    lenient = _Planner({**options, "failOnDataLoss": "false"})
    lenient.lows = {("t", 0): 100}
    assert lenient.ranges({("t", 0): 40}, {("t", 0): 150}) == [KafkaRange("t", 0, 100, 150)]


def test_reader_pickles_without_clients() -> None:
    reader = KafkaStreamReader({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"})
    reader._plan.client._metadata_consumer()  # a live client must not travel to executors
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._plan.client._meta is None
    reader.stop()


# --------------------------------------------------------------------------- broker, no Spark


def test_log_end_is_confirmed_by_fetch_on_batched_records(stack_settings: Settings, unique: str) -> None:
    topic = new_topic(stack_settings, unique)
    produce(stack_settings.kafka, topic, 10_000, partitions=1, linger_ms=100)
    tp = (topic, 0)
    consumer = Consumer({**stack_settings.kafka.client_config(), "group.id": "wm"})
    reported = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    consumer.close()
    client = OffsetClient(stack_settings.kafka.client_config())
    try:
        started = time.monotonic()
        _, ends = client.log_ends([tp])
        assert ends[tp] == 10_000, f"ListOffsets said {reported}"
        print(f"ListOffsets(latest) reported {reported} of 10000")
        for _ in range(3):  # reused consumers: later calls stay right (and cheap)
            assert client.log_ends([tp])[1][tp] == 10_000
        assert time.monotonic() - started < 5
    finally:
        client.close()
    # And an executor-side read of the whole range returns every record, in order.
    opts = ReadOptions.parse({**kafka_options(stack_settings.kafka, "python"), "chunkRows": "3000"})
    batches = list(read_range(opts, KafkaRange(topic, 0, 0, 10_000)))
    assert [b.num_rows for b in batches] == [3000, 3000, 3000, 1000]
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(10_000))
    _CONSUMERS.close()


def test_a_worker_reuses_its_consumer_for_the_next_range_and_reads_any_range_exactly(
    stack_settings: Settings, unique: str
) -> None:
    """Consecutive ranges (the next micro-batch) continue with the cached consumer; a range
    elsewhere (a replayed batch, a re-read) is served exactly too."""
    topic = new_topic(stack_settings, unique)
    produce(stack_settings.kafka, topic, 3000, partitions=1, linger_ms=100)
    opts = ReadOptions.parse({**kafka_options(stack_settings.kafka, "python"), "chunkRows": "700"})

    def offsets(start: int, end: int) -> list[int]:
        return [o for b in read_range(opts, KafkaRange(topic, 0, start, end)) for o in b.column("offset").to_pylist()]

    try:
        assert offsets(0, 1000) == list(range(0, 1000))
        consumer = next(iter(_CONSUMERS._entries.values())).consumer
        assert offsets(1000, 2000) == list(range(1000, 2000))
        assert next(iter(_CONSUMERS._entries.values())).consumer is consumer
        assert offsets(500, 1500) == list(range(500, 1500))  # replayed: re-assigned at its start
        assert offsets(1500, 3000) == list(range(1500, 3000))
        assert len(_CONSUMERS._entries) == 1
    finally:
        _CONSUMERS.close()


def test_read_past_log_end_times_out_clearly(stack_settings: Settings, unique: str) -> None:
    topic = new_topic(stack_settings, unique)
    produce(stack_settings.kafka, topic, 8, partitions=4)
    opts = ReadOptions.parse({**kafka_options(stack_settings.kafka, "python"), "kafkaConsumer.pollTimeoutMs": "1500"})
    with pytest.raises(TimeoutError, match="no record after offset 2"):
        list(read_range(opts, KafkaRange(topic, 1, 0, 5)))
    assert not _CONSUMERS._entries  # a failed read does not keep its consumer


# --------------------------------------------------------------------------- Spark


@pytest.mark.slow
def test_every_record_once_with_columns(spark, stack_settings: Settings, unique: str, tmp_path: Path) -> None:
    topic = new_topic(stack_settings, unique)
    produce(stack_settings.kafka, topic, 2000)
    produce(stack_settings.kafka, topic, 10_000, partitions=1, first=2000, linger_ms=100)  # one big batch
    df = read_kafka_stream(spark, stack_settings.kafka, [topic])
    query = (
        df.writeStream.format("memory")
        .queryName(f"all_{unique}")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    rows = spark.table(f"all_{unique}").collect()
    assert len(rows) == 12_000
    assert len({(r.partition, r.offset) for r in rows}) == 12_000
    by_value = {bytes(r.value): r for r in rows}
    for i in (0, 1, 2, 3, 1999, 2000, 11_999):
        row = by_value[b"v%d" % i]
        assert bytes(row.key) == b"k%d" % i and row.topic == topic
        assert row.partition == (i % 4 if i < 2000 else 0)
        assert row.timestampType == 0
        assert int(row.timestamp.timestamp() * 1000) == BASE_TS + i
        headers = [(h.key, bytes(h.value)) for h in row.headers] if row.headers else None
        assert headers == ([("seq", str(i).encode()), ("src", b"test")] if i % 3 else None)
    assert sorted({r.partition for r in rows}) == [0, 1, 2, 3]


@pytest.mark.slow
def test_max_offsets_per_trigger(stack_settings: Settings, unique: str, run_stream) -> None:
    topic = new_topic(stack_settings, unique)
    produce(stack_settings.kafka, topic, 1000)
    query, collector = run_stream([topic], max_offsets_per_trigger=300, trigger={"availableNow": True})
    query.awaitTermination(120)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [300, 300, 300, 100]
    assert_exactly(collector, range(1000))


@pytest.mark.slow
def test_restart_resumes_from_checkpoint(stack_settings: Settings, unique: str, run_stream) -> None:
    topic = new_topic(stack_settings, unique)
    produce(stack_settings.kafka, topic, 2000)
    collector = Collector()
    query, _ = run_stream(
        [topic], collector, max_offsets_per_trigger=150, trigger={"processingTime": "100 milliseconds"}
    )
    deadline = time.monotonic() + 60
    while len(collector.rows()) < 300 and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()  # mid-stream: part of the backlog is still unread
    first_run = len(collector.rows())
    assert 300 <= first_run < 2000
    produce(stack_settings.kafka, topic, 500, first=2000)
    query, _ = run_stream([topic], collector)
    query.processAllAvailable()
    assert_exactly(collector, range(2500))


@pytest.mark.slow
def test_starting_offsets_latest_and_json(stack_settings: Settings, unique: str, run_stream) -> None:
    topic = new_topic(stack_settings, unique)
    produce(stack_settings.kafka, topic, 400)  # 100 per partition
    latest, latest_rows = run_stream([topic], checkpoint="latest", starting_offsets="latest")
    latest.processAllAvailable()
    assert latest_rows.rows() == []
    explicit = json.dumps({topic: {"0": 90, "1": -2, "2": -1}})  # partition 3 unnamed: earliest
    chosen, chosen_rows = run_stream([topic], checkpoint="json", starting_offsets=explicit)
    chosen.processAllAvailable()
    produce(stack_settings.kafka, topic, 40, first=400)
    latest.processAllAvailable()
    chosen.processAllAvailable()
    assert_exactly(latest_rows, range(400, 440))
    expected = [i for i in range(440) if (i % 4 == 0 and i // 4 >= 90) or i % 4 in (1, 3) or i >= 400]
    assert chosen_rows.values() == sorted(b"v%d" % i for i in expected)


@pytest.mark.slow
def test_topics_gaining_data_after_start(stack_settings: Settings, unique: str, run_stream) -> None:
    empty = new_topic(stack_settings, unique, "empty")
    later = f"test.{unique}.later"  # does not exist when the query starts
    query, collector = run_stream([empty, later], starting_offsets="latest")
    query.processAllAvailable()
    produce(stack_settings.kafka, empty, 200)
    query.processAllAvailable()
    assert_exactly(collector, range(200))
    ensure_topics(stack_settings.kafka, [later])
    produce(stack_settings.kafka, later, 100, first=200)  # new partitions: read from earliest
    query.processAllAvailable()
    assert_exactly(collector, range(300))


@pytest.mark.slow
def test_batch_read(spark, stack_settings: Settings, unique: str) -> None:
    topic = new_topic(stack_settings, unique)
    produce(stack_settings.kafka, topic, 1000)
    df = read_kafka_batch(spark, stack_settings.kafka, [topic], starting_offsets=json.dumps({topic: {"0": 200}}))
    assert df.count() == 50 + 750  # partition 0 from offset 200 of 250; the others from earliest
    assert df.schema == KafkaDataSource({}).schema()
    split = (
        spark.read.format("iotwatch-kafka")
        .options(**kafka_options(stack_settings.kafka, "python"))
        .option("subscribe", topic)
        .option("minPartitions", "8")
        .load()
    )
    assert split.rdd.getNumPartitions() == 8
    assert split.select("partition", "offset").distinct().count() == 1000
    # more moving partitions than maxPartitions: tasks read several ranges in turn
    grouped = (
        spark.read.format("iotwatch-kafka")
        .options(**kafka_options(stack_settings.kafka, "python"))
        .option("subscribe", topic)
        .option("maxPartitions", "2")
        .load()
    )
    assert grouped.rdd.getNumPartitions() == 2
    assert grouped.select("partition", "offset").distinct().count() == grouped.count() == 1000


def test_group_ranges_for_max_partitions() -> None:
    ranges = [("t", p, 0, size) for p, size in enumerate([500, 400, 300, 200, 100, 100])]
    groups = group_ranges(ranges, 2)
    assert len(groups) == 2 and sorted(r for g in groups for r in g) == ranges
    assert sorted(sum(e - s for _, _, s, e in g) for g in groups) == [800, 800]
    assert group_ranges(ranges, None) == [[r] for r in ranges] == group_ranges(ranges, 6)
