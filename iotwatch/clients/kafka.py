"""Kafka helpers on confluent-kafka: health checks, topic creation, reading a topic whole."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from iotwatch.errors import ServiceUnavailable
from iotwatch.settings import KafkaSettings


def client_config(settings: KafkaSettings) -> dict[str, Any]:
    """Connection properties for a confluent-kafka client, with librdkafka's log lines going
    through Python logging (repeated connection failures summarised, :mod:`iotwatch.logs`)
    instead of straight to stderr."""
    from iotwatch.logs import librdkafka_logger

    return {**settings.client_config(), "logger": librdkafka_logger()}


def admin_client(settings: KafkaSettings) -> AdminClient:
    return AdminClient(client_config(settings))


def list_topics(settings: KafkaSettings, timeout_s: float = 5.0) -> dict[str, int]:
    """Topic name -> partition count, or :class:`ServiceUnavailable`."""
    admin = admin_client(settings)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            admin.poll(0)  # librdkafka's own account of the failure (queued until polled)
        raise ServiceUnavailable(f"Kafka at {settings.bootstrap_servers} did not answer: {exc}") from exc
    return {name: len(topic.partitions) for name, topic in metadata.topics.items()}


def ensure_topics(
    settings: KafkaSettings, topics: list[str], timeout_s: float = 15.0, *, compacted: bool = False
) -> list[str]:
    """Create the topics that do not exist yet (with the configured partition count;
    ``compacted``: ``cleanup.policy=compact``, the latest record per key is kept).

    Returns the names created. An existing topic is left as it is, whatever its
    partition count: changing it would break per-key order for data already there.
    """
    existing = list_topics(settings, timeout_s)
    missing = [name for name in dict.fromkeys(topics) if name not in existing]
    if not missing:
        return []
    admin = admin_client(settings)  # keep a reference: the futures die with their client
    futures = admin.create_topics(
        [
            NewTopic(
                name,
                num_partitions=settings.partitions,
                replication_factor=settings.replication_factor,
                config={"cleanup.policy": "compact"} if compacted else {},
            )
            for name in missing
        ],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise ServiceUnavailable(f"cannot create Kafka topic {name}: {exc}") from exc
    _wait_listed(settings, created, timeout_s)
    return created


def _wait_listed(settings: KafkaSettings, topics: list[str], timeout_s: float) -> None:
    """Wait until the broker lists topics just created: it answers a creation once the
    controller committed it and updates its own metadata a moment later, and a reader that
    asked in between would take a topic for missing (and a follower never read it)."""
    deadline = time.monotonic() + timeout_s
    while topics and not all(list_topics(settings, timeout_s).get(name) for name in topics):
        if time.monotonic() > deadline:
            raise ServiceUnavailable(f"Kafka created {', '.join(topics)} but did not list them within {timeout_s:g} s")
        time.sleep(0.05)


def read_to_end(settings: KafkaSettings, topic: str, timeout_s: float = 120.0) -> list[Message]:
    """Every record of a topic, from the beginning to the end each partition had when it was
    reached (partition EOF: the high watermark of the fetch, which is exact on every
    broker). No group is joined and no offset committed; an unknown topic reads as empty."""
    follower = TopicFollower(settings, [topic])
    try:
        return follower.catch_up(timeout_s, strict=False)
    finally:
        follower.close()


#: ``fetch.wait.max.ms`` of consumers that follow a topic for people or devices waiting on it
#: (the responder, alert dispatch, ``iotwatch alerts tail``). Kafka answers a waiting fetch as
#: soon as a record arrives, so this costs no latency; it bounds how long an idle follower's
#: fetch stays open (a stop or a new assignment waits for it). An idle follower asks 10 times a second.
FOLLOW_FETCH_WAIT_MS = 100


class TopicFollower:
    """Reads whole topics from the beginning and then follows them: the way a component
    rebuilds its state from compacted logs on start (event sourcing). Every partition is
    assigned, no group is joined, no offset committed. Topics missing at start read as empty."""

    def __init__(self, settings: KafkaSettings, topics: list[str]) -> None:
        existing = list_topics(settings)
        # from each partition's log start, not offset 0: once retention deleted offset 0, a
        # fetch there is out of range and the consumer would jump to the end, reading nothing
        self.partitions = [
            TopicPartition(topic, p, OFFSET_BEGINNING) for topic in topics for p in range(existing.get(topic, 0))
        ]
        self._consumer = Consumer(
            {
                **client_config(settings),
                "group.id": f"iotwatch-follow-{time.time_ns()}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": FOLLOW_FETCH_WAIT_MS,
            }
        )
        if self.partitions:
            self._consumer.assign(self.partitions)

    def catch_up(self, timeout_s: float = 120.0, *, strict: bool = True) -> list[Message]:
        """The records up to the end each partition had when reached (partition EOF);
        ``strict``: :class:`ServiceUnavailable` when a partition's end was not reached in time."""
        records: list[Message] = []
        at_end: set[tuple[str, int]] = set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < len(self.partitions) and time.monotonic() < deadline:
            for message in self._consumer.consume(5000, 1.0):
                if message.error() is None:
                    records.append(message)
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add((message.topic(), message.partition()))
        if strict and len(at_end) < len(self.partitions):
            raise ServiceUnavailable(
                f"Kafka: could not read {len(self.partitions) - len(at_end)} partition(s) "
                f"to their end within {timeout_s:.0f} s"
            )
        return records

    def poll(self, timeout_s: float) -> list[Message]:
        """New records (errors such as partition EOF left out)."""
        if not self.partitions:
            time.sleep(timeout_s)
            return []
        return [m for m in self._consumer.consume(5000, timeout_s) if m.error() is None]

    def close(self) -> None:
        self._consumer.close()


def produce_confirmed(
    producer: Producer,
    topic: str,
    key: bytes,
    value: bytes,
    headers: list[tuple[str, bytes]] | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Produce one record and wait until the broker confirmed it, or :class:`ServiceUnavailable`:
    for records whose loss would go unnoticed (an acknowledgement, a notification sent)."""
    errors: list[str] = []
    producer.produce(
        topic,
        value,
        key=key,
        headers=headers or [],
        on_delivery=lambda err, _msg: errors.append(str(err)) if err is not None else None,
    )
    if producer.flush(timeout_s) > 0 or errors:
        raise ServiceUnavailable(f"Kafka did not confirm a record on {topic}: {errors[0] if errors else 'timeout'}")
