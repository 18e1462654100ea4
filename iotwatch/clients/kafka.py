"""Kafka helpers on confluent-kafka: health checks, topic creation, reading a topic whole."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
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


def ensure_topics(settings: KafkaSettings, topics: list[str], timeout_s: float = 15.0) -> list[str]:
    """Create the topics that do not exist yet (with the configured partition count).

    Returns the names created. An existing topic is left as it is, whatever its
    partition count: changing it would break per-key order for data already there.
    """
    existing = list_topics(settings, timeout_s)
    missing = [name for name in dict.fromkeys(topics) if name not in existing]
    if not missing:
        return []
    admin = admin_client(settings)  # keep a reference: the futures die with their client
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=settings.partitions, replication_factor=settings.replication_factor)
         for name in missing],
        operation_timeout=timeout_s, request_timeout=timeout_s,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise ServiceUnavailable(f"cannot create Kafka topic {name}: {exc}") from exc
    return created


def read_to_end(settings: KafkaSettings, topic: str, timeout_s: float = 120.0) -> list[Message]:
    """Every record of a topic, from the beginning to the end each partition had when it was
    reached (partition EOF: the high watermark of the fetch, which is exact on every
    broker). No group is joined and no offset committed; an unknown topic reads as empty."""
    partitions = list_topics(settings).get(topic, 0)
    if not partitions:
        return []
    consumer = Consumer({**client_config(settings), "group.id": f"iotwatch-read-{time.time_ns()}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: list[Message] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(at_end) < partitions and time.monotonic() < deadline:
            for message in consumer.consume(5000, 1.0):
                if message.error() is None:
                    records.append(message)
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
    finally:
        consumer.close()
    return records
