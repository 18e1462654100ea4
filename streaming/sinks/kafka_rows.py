"""Producing rows to Kafka from Spark tasks, failing the task if any delivery fails."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaError, Producer

from iotwatch.errors import ServiceUnavailable

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


def produce_all(config: dict[str, str], topic: str, records: Iterable[Record], timeout_s: float = 60.0) -> int:
    """Produce every (key, value, headers) and wait for all confirmations, or raise."""
    producer = Producer({**config, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    count = 0
    for key, value, headers in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
        producer.poll(0)
    remaining = producer.flush(timeout_s)
    if remaining or errors:
        raise ServiceUnavailable(f"{len(errors) + remaining} record(s) to {topic} not confirmed by Kafka "
                                 f"(first error: {errors[0] if errors else 'timeout'})")
    return count
