"""Model-update events: what the registry announces on the model-updates Kafka topic.

One JSON object per event, keyed by ``device_type`` (so a device type's events stay in
order within one partition)::

    {"device_type": "thermostat", "detector": "isolation_forest", "version": 3,
     "status": "approved", "path": ".../v000003/model.bin", "created_at": "2025-...+00:00"}

The registry on disk stays the source of truth: an event only says "look again", so a
lost or reordered event cannot make a watcher use a model that is not the newest approved.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException, Producer

from iotwatch.clients.kafka import client_config, ensure_topics
from iotwatch.errors import ServiceUnavailable
from iotwatch.settings import KafkaSettings

if TYPE_CHECKING:
    from models.registry import ModelVersion

__all__ = ["ModelUpdate", "UpdatePublisher"]


@dataclass(frozen=True)
class ModelUpdate:
    """One model-update event.

    >>> event = ModelUpdate("thermostat", "isolation_forest", 3, "approved", "/r/v000003/model.bin",
    ...                     "2025-01-01T00:00:00+00:00")
    >>> ModelUpdate.from_bytes(event.to_bytes()) == event
    True
    """

    device_type: str
    detector: str
    version: int
    status: str
    path: str
    created_at: str

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, payload: bytes) -> ModelUpdate:
        """Parse an event; :class:`ValueError` when it is not one."""
        try:
            doc: dict[str, Any] = json.loads(payload)
            return cls(
                device_type=str(doc["device_type"]),
                detector=str(doc["detector"]),
                version=int(doc["version"]),
                status=str(doc.get("status", "approved")),
                path=str(doc.get("path", "")),
                created_at=str(doc.get("created_at", "")),
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"not a model-update event: {exc}") from None

    @classmethod
    def of(cls, version: ModelVersion) -> ModelUpdate:
        return cls(**version.event())


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
        event = version if isinstance(version, ModelUpdate) else ModelUpdate.of(version)
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
