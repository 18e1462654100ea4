"""Publishing model-update events (:class:`iotwatch.contract.model_updates.ModelUpdate`) to
the model-updates Kafka topic, waiting for the broker's ack."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException, Producer

from iotwatch.clients.kafka import client_config, ensure_topics
from iotwatch.contract.model_updates import ModelUpdate
from iotwatch.errors import ServiceUnavailable
from iotwatch.settings import KafkaSettings

if TYPE_CHECKING:
    from iotwatch.models.registry import ModelVersion

__all__ = ["UpdatePublisher"]


class UpdatePublisher:
    """Publishes model-update events with confluent-kafka, waiting for the broker's ack.

    Parameters
    ----------
    kafka
        Connection settings.
    topic
        The model-updates topic (``settings.topics.model_updates``); created when missing.
    timeout_s
        How long :meth:`publish` waits for delivery before raising :class:`ServiceUnavailable`.
    """

    def __init__(self, kafka: KafkaSettings, topic: str, timeout_s: float = 15.0) -> None:
        self.kafka = kafka
        self.topic = topic
        self.timeout_s = timeout_s
        self._producer: Producer | None = None

    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            ensure_topics(self.kafka, [self.topic], self.timeout_s)
            self._producer = Producer(
                {
                    **client_config(self.kafka),
                    "acks": "all",
                    "enable.idempotence": True,
                    "message.timeout.ms": int(self.timeout_s * 1000),
                }
            )
        return self._producer

    def publish(self, version: ModelVersion | ModelUpdate) -> ModelUpdate:
        """Send one event and wait until Kafka has it."""
        event = version if isinstance(version, ModelUpdate) else version.update()
        producer = self._ensure_producer()
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        try:
            producer.produce(self.topic, key=event.device_type.encode(), value=event.to_bytes(), on_delivery=delivered)
        except (KafkaException, BufferError) as exc:
            raise ServiceUnavailable(f"cannot publish model update to {self.topic}: {exc}") from exc
        if producer.flush(self.timeout_s) > 0:
            raise ServiceUnavailable(
                f"Kafka at {self.kafka.bootstrap_servers} did not confirm the model update within {self.timeout_s:g} s"
            )
        if errors:
            raise ServiceUnavailable(f"model update to {self.topic} failed: {errors[0]}")
        return event

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.timeout_s)
            self._producer = None
