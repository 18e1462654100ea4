"""Library output through Python logging: librdkafka's repeated connection failures summarised."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import Producer

from iotwatch.application.stack.process import free_port
from iotwatch.clients.kafka import client_config
from iotwatch.logs import LIBRDKAFKA, RepeatSummary, configure
from iotwatch.settings import KafkaSettings


def test_a_producer_that_cannot_connect_logs_one_line_per_broker(caplog: pytest.LogCaptureFixture) -> None:
    """A long-running client (the gateway's producer) against brokers that refuse: librdkafka
    retries many times a second; the log shows one WARNING per broker, the rest at DEBUG."""
    configure("INFO")
    ports = [free_port(), free_port()]
    kafka = KafkaSettings(bootstrap_servers=",".join(f"127.0.0.1:{p}" for p in ports))
    producer = Producer({**client_config(kafka), "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 100})
    producer.produce("t", b"x")
    with caplog.at_level(logging.DEBUG, logger=LIBRDKAFKA):
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            producer.poll(0.2)
    shown = [r for r in caplog.records if r.name == LIBRDKAFKA and r.levelno >= logging.WARNING]
    assert sorted(r.getMessage().split(":")[0] for r in shown) == ["Kafka broker 127.0.0.1"] * len(ports)
    assert all("Connection refused (retrying; repeats are logged at DEBUG)" in r.getMessage() for r in shown)
    assert sum(r.levelno == logging.DEBUG for r in caplog.records if r.name == LIBRDKAFKA) >= 2
    producer.purge()


def test_spark_jvm_output_lines_become_log_records_at_sane_levels(caplog: pytest.LogCaptureFixture) -> None:
    """What the JVM prints (log4j lines in iotwatch's layout, stack traces, the Python
    workers' prints and librdkafka lines) as Python log records: news at its level, detail
    at DEBUG, everything at DEBUG while a stop interrupts work."""
    import io

    from iotwatch.jvm.spark import JvmOutput, quiet_stop

    configure("INFO")
    output = JvmOutput(io.BytesIO(b""))
    lines = [
        "WARN org.apache.spark.scheduler.TaskSetManager: Lost task 1.0",
        "java.lang.InterruptedException",
        "\tat org.apache.spark.SparkContext.runJob(SparkContext.scala:2499)",
        "ERROR org.apache.spark.sql.execution.datasources.FileFormatWriter: Aborting job a85.",
        "Starting Streaming TransformWithStateInPandas Python worker.",
        "WARN org.apache.spark.util.Utils: Your hostname, vm, resolves to a loopback address",
        "%3|1795479906.881|FAIL|rdkafka#consumer-9| [thrd:127.0.0.1:7/bootstrap]: 127.0.0.1:7/bootstrap: "
        "Connect to ipv4#127.0.0.1:7 failed: Connection refused (after 0ms in state CONNECT)",
    ]
    with caplog.at_level(logging.DEBUG):
        for line in lines:
            output.emit(line)
        with quiet_stop():
            output.emit("ERROR org.apache.spark.sql.execution.datasources.FileFormatWriter: Aborting job b96.")
            output.emit('Exception in thread "stream execution thread" java.lang.StackOverflowError')
    got = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    expected = [
        ("spark.TaskSetManager", "WARNING", "Lost task 1.0"),
        ("spark.jvm", "DEBUG", "java.lang.InterruptedException"),
        ("spark.jvm", "DEBUG", "\tat org.apache.spark.SparkConte"),
        ("spark.FileFormatWriter", "ERROR", "Aborting job a85."),
        ("spark.jvm", "DEBUG", "Starting Streaming TransformWit"),
        ("spark.Utils", "DEBUG", "Your hostname, vm, resolves to"),
        (LIBRDKAFKA, "WARNING", "Kafka broker 127.0.0.1:7: Conne"),
        ("spark.FileFormatWriter", "DEBUG", "Aborting job b96."),
        ("spark.jvm", "DEBUG", 'Exception in thread "stream ex'),
    ]
    assert len(got) == len(expected), got
    for (name, level, message), (want_name, want_level, start) in zip(got, expected, strict=True):
        assert (name, level) == (want_name, want_level) and message.startswith(start), (name, level, message)


@pytest.mark.parametrize(
    "detail",
    ["(after 0ms in state CONNECT)", "(after 5ms in state CONNECT, 1 identical error(s) suppressed)"],
)
def test_a_repeated_failure_s_counters_leave_the_summary_whole(detail: str) -> None:
    """librdkafka's "(after Nms ..., N identical error(s) suppressed)" is dropped as a whole,
    so the line reads "Connection refused" with no stray bracket."""
    record = logging.LogRecord(
        LIBRDKAFKA,
        logging.WARNING,
        __file__,
        1,
        f"FAIL [rdkafka#producer-1] [thrd:127.0.0.1:9/bootstrap]: 127.0.0.1:9/bootstrap: "
        f"Connect to ipv4#127.0.0.1:9 failed: Connection refused {detail}",
        None,
        None,
    )
    assert RepeatSummary().filter(record)
    assert record.getMessage() == (
        "Kafka broker 127.0.0.1:9: Connect to 127.0.0.1:9 failed: Connection refused "
        "(retrying; repeats are logged at DEBUG)"
    )


def test_spark_s_kafka_clients_on_a_broker_that_is_down_log_one_line_per_outage(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Kafka source's clients repeat "could not be established" every second while a
    broker is down, and the source fails to get offsets: one WARNING for the outage, whatever
    the client, the repeats at DEBUG; the driver's clients seeing the broker up again say so
    once, and its next outage is news again (as is one after a quiet spell)."""
    import io
    import json

    from iotwatch.jvm.spark import JvmOutput
    from iotwatch.logs import FOLD_S, GRACE_S, broker_states, repeat_summary

    configure("INFO")
    monkeypatch.setattr(JvmOutput, "quiet_until", 0.0)  # not right after another test's stop
    now = [0.0]
    summary = repeat_summary()
    monkeypatch.setattr(summary, "clock", lambda: now[0])
    monkeypatch.setattr(summary, "_down", {})
    monkeypatch.setattr(summary, "_back", {})
    output = JvmOutput(io.BytesIO(b""))
    consumer = (
        "WARN org.apache.kafka.clients.NetworkClient: [Consumer clientId=consumer-spark-1, groupId=spark-1] "
        "Connection to node 1 (localhost/127.0.0.1:9092) could not be established. Node may not be available."
    )
    admin = (
        "WARN org.apache.kafka.clients.NetworkClient: [AdminClient clientId=adminclient-1] Connection to node -1 "
        "(localhost/127.0.0.1:9092) could not be established. Broker may not be available."
    )
    offsets = "WARN org.apache.spark.sql.kafka010.KafkaOffsetReaderAdmin: Error in attempt 2 getting Kafka offsets:"
    driver = (
        "%3|1795479906.881|FAIL|rdkafka#producer-1| [thrd:127.0.0.1:9092/1]: 127.0.0.1:9092/1: "
        "Connect to ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)"
    )
    up = json.dumps({"brokers": {"127.0.0.1:9092/1": {"nodename": "127.0.0.1:9092", "state": "UP"}}})
    with caplog.at_level(logging.DEBUG):
        for second in range(120):  # a two-minute outage
            now[0] = float(second)
            output.emit(consumer)
            output.emit(admin)
            output.emit(driver)
            if second % 60 == 59:
                output.emit(offsets)
                output.emit("org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node")
        broker_states(up)
        now[0] = 120 + GRACE_S / 2
        output.emit(consumer)  # a client not yet reconnected: no new outage
        now[0] = 120 + GRACE_S
        output.emit(consumer)  # the next outage
        now[0] = 120 + GRACE_S + FOLD_S
        output.emit(consumer)  # ... and one after five quiet minutes
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "Kafka" in r.getMessage()]
    down = "Kafka broker 127.0.0.1:9092 unreachable from Spark's Kafka clients (retrying; repeats are logged at DEBUG)"
    assert said == [down, "Kafka broker 127.0.0.1:9092 answers again", down, down]


def test_a_consumer_s_coordinator_and_broker_connections_are_one_outage(caplog: pytest.LogCaptureFixture) -> None:
    """A consumer losing its broker reports the coordinator's connection, the broker's
    disconnection and the refused reconnects: one line for the broker; a partition's new
    leader missing from the metadata cache around the restart is at DEBUG."""
    lines = [
        "METADATAUPDATE [rdkafka#consumer-2] [thrd:main]: Partition iot.alerts(qWCMw6QnTwCaAk/VPiacNQ)[1]: "
        "new leader-1 not found in cache",
        "FAIL [rdkafka#consumer-2] [thrd:GroupCoordinator]: GroupCoordinator: 127.0.0.1:19093: "
        "Connect to ipv4#127.0.0.1:19093 failed: Connection refused (after 0ms in state CONNECT)",
        "FAIL [rdkafka#consumer-2] [thrd:127.0.0.1:19093/1]: 127.0.0.1:19093/1: Disconnected: connection closed "
        "by peer: receive 0 after POLLIN (after 5001ms in state UP)",
        "FAIL [rdkafka#consumer-2] [thrd:127.0.0.1:19093/1]: 127.0.0.1:19093/1: "
        "Connect to ipv4#127.0.0.1:19093 failed: Connection refused (after 0ms in state CONNECT)",
    ]
    summary = RepeatSummary()
    records = [logging.LogRecord(LIBRDKAFKA, logging.WARNING, __file__, 1, line, None, None) for line in lines]
    shown = [r.getMessage() for r in records if summary.filter(r) and r.levelno >= logging.WARNING]
    assert shown == [
        "Kafka broker 127.0.0.1:19093: Connect to 127.0.0.1:19093 failed: Connection refused "
        "(retrying; repeats are logged at DEBUG)"
    ]


def test_a_broker_that_answers_again_is_said_once_and_its_next_outage_is_news(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """librdkafka's statistics say a broker is ``UP`` again: one line that it answers (only for
    a broker whose failure was reported), and its next failure, once another client had time
    to reconnect, is reported again."""
    import json

    from iotwatch.logs import GRACE_S, broker_states, librdkafka_logger, repeat_summary

    configure("INFO")
    logger = librdkafka_logger()
    now = [0.0]
    monkeypatch.setattr(repeat_summary(), "clock", lambda: now[0])
    failure = (
        "FAIL [rdkafka#consumer-3] [thrd:127.0.0.1:19092/bootstrap]: 127.0.0.1:19092/bootstrap: "
        "Connect to ipv4#127.0.0.1:19092 failed: Connection refused (after 0ms in state CONNECT)"
    )

    def stats(state: str) -> str:
        return json.dumps({"brokers": {"127.0.0.1:19092/1": {"nodename": "127.0.0.1:19092", "state": state}}})

    with caplog.at_level(logging.INFO):
        broker_states(stats("UP"))  # never reported down: nothing to say
        logger.warning(failure)
        logger.warning(failure)
        broker_states(stats("CONNECT"))
        broker_states(stats("UP"))
        broker_states(stats("UP"))
        now[0] += GRACE_S
        logger.warning(failure)
    down = (
        "Kafka broker 127.0.0.1:19092: Connect to 127.0.0.1:19092 failed: Connection refused "
        "(retrying; repeats are logged at DEBUG)"
    )
    assert [r.getMessage() for r in caplog.records] == [down, "Kafka broker 127.0.0.1:19092 answers again", down]
