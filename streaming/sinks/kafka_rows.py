"""Producing rows to Kafka from Spark tasks, failing the task if any delivery fails."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException, Producer

from iotwatch.clients.kafka import produce_waiting
from iotwatch.errors import ServiceUnavailable

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]

log = logging.getLogger(__name__)


_producers: dict[tuple[tuple[str, str], ...], Producer] = {}


def _producer(config: dict[str, str]) -> Producer:
    """One idempotent producer per configuration and Python worker, kept for the worker's
    life: creating one per micro-batch costs connections and metadata round trips."""
    key = tuple(sorted(config.items()))
    producer = _producers.get(key)
    if producer is None:
        from iotwatch.logs import librdkafka_logger

        producer = _producers[key] = Producer(
            {**config, "enable.idempotence": True, "acks": "all", "linger.ms": 2, "logger": librdkafka_logger()}
        )
        # Connect and load the metadata now: a fresh idempotent producer's first record
        # would wait for both (and its producer id), on the first micro-batch with an alert.
        # Warm, the first record is confirmed in a millisecond.
        try:
            producer.list_topics(timeout=5)
        except KafkaException as exc:  # Kafka down: the first produce fails with the full story
            log.debug("Kafka producer warm-up: %s", exc)
    return producer


def warm_producer(config: dict[str, str]) -> None:
    """Create (and connect) this worker's producer for ``config`` before it is needed."""
    _producer(config)


def produce_all(config: dict[str, str], topic: str, records: Iterable[Record], timeout_s: float = 60.0) -> int:
    """Produce every (key, value, headers) and wait for all confirmations, or raise."""
    producer = _producer(config)
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    count = 0
    for key, value, headers in records:
        produce_waiting(producer, topic, key, value, headers=list(headers), on_delivery=on_delivery)
        count += 1
        producer.poll(0)
    remaining = producer.flush(timeout_s)
    if remaining or errors:
        _producers.pop(tuple(sorted(config.items())), None)  # the next batch starts with a fresh one
        raise ServiceUnavailable(
            f"{len(errors) + remaining} record(s) to {topic} not confirmed by Kafka "
            f"(first error: {errors[0] if errors else 'timeout'})"
        )
    return count
