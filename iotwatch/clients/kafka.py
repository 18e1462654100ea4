"""Kafka admin helpers on confluent-kafka: health checks and topic creation."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from iotwatch.errors import ServiceUnavailable
from iotwatch.settings import KafkaSettings


def admin_client(settings: KafkaSettings) -> AdminClient:
    return AdminClient(settings.client_config())


def list_topics(settings: KafkaSettings, timeout_s: float = 5.0) -> dict[str, int]:
    """Topic name -> partition count, or :class:`ServiceUnavailable`."""
    try:
        metadata = admin_client(settings).list_topics(timeout=timeout_s)
    except KafkaException as exc:
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
