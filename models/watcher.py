"""Hot-swap fleet models in a running scorer by following the model-updates topic.

:class:`ModelWatcher` starts by noting the end of every partition of the model-updates
topic, *then* loads the newest approved version of every ``(device_type, detector)``
from the registry. Because the registry writes to disk before it publishes, an approval
is either already on disk at start-up or announced after the noted offsets: none is
missed. Afterwards :meth:`ModelWatcher.current_version` polls the consumer without waiting (at
most every ``check_interval_s``) and, only for families an event mentions, reads the
registry again and loads the new newest approved version. The disk decides what is
current; events only say when to look.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Self

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from iotwatch.clients.kafka import client_config, ensure_topics
from iotwatch.contract.model_updates import ModelUpdate
from iotwatch.errors import ServiceUnavailable
from iotwatch.models.base import Detector
from iotwatch.models.registry import ModelRegistry, ModelVersion
from iotwatch.settings import KafkaSettings

__all__ = ["ModelWatcher"]

log = logging.getLogger(__name__)

Family = tuple[str, str]


class ModelWatcher:
    """The newest approved model per ``(device_type, detector)``, kept current without restarts.

    Parameters
    ----------
    registry
        The registry the events refer to (the watcher loads from it).
    kafka
        Connection settings.
    topic
        The model-updates topic (``settings.topics.model_updates``).
    check_interval_s
        Minimum time between two polls of the topic in :meth:`current_version`; 0 polls every call.
    timeout_s
        Start-up timeout for Kafka metadata and offsets.

    Use as a context manager, or call :meth:`start` and :meth:`close`. Thread-safe. The
    returned detectors are shared: a scorer that lets them learn changes the shared copy.
    """

    def __init__(
        self,
        registry: ModelRegistry,
        kafka: KafkaSettings,
        topic: str,
        *,
        check_interval_s: float = 1.0,
        timeout_s: float = 15.0,
    ) -> None:
        self.registry = registry
        self.kafka = kafka
        self.topic = topic
        self.check_interval_s = check_interval_s
        self.timeout_s = timeout_s
        self._consumer: Consumer | None = None
        self._lock = threading.RLock()
        self._models: dict[Family, tuple[ModelVersion, Detector] | None] = {}
        self._dirty: set[Family] = set()
        self._last_check = 0.0
        self.events_seen = 0
        self.reloads = 0

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> Self:
        """Assign every partition at its current end, then load what is approved on disk."""
        with self._lock:
            if self._consumer is not None:
                return self
            ensure_topics(self.kafka, [self.topic], self.timeout_s)
            consumer = Consumer(
                {
                    **client_config(self.kafka),
                    "group.id": f"iotwatch-model-watcher-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "latest",
                    "enable.partition.eof": False,
                }
            )
            try:
                metadata = consumer.list_topics(self.topic, timeout=self.timeout_s)
                partitions = sorted(metadata.topics[self.topic].partitions)
                if not partitions:
                    raise ServiceUnavailable(f"topic {self.topic} has no partitions")
                assignment = []
                for p in partitions:
                    _low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=self.timeout_s)
                    assignment.append(TopicPartition(self.topic, p, high if high >= 0 else OFFSET_END))
                consumer.assign(assignment)
            except KafkaException as exc:
                consumer.close()
                raise ServiceUnavailable(
                    f"cannot follow {self.topic} at {self.kafka.bootstrap_servers}: {exc}"
                ) from exc
            except BaseException:
                consumer.close()
                raise
            self._consumer = consumer
            for family in self.registry.approved_families():
                self._reload(family)
            self._last_check = time.monotonic()
        return self

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- use ------------------------------------------------------------------------

    def current_version(self, device_type: str, detector: str) -> tuple[ModelVersion, Detector] | None:
        """The newest approved version of the family and its detector, or ``None`` when none is approved."""
        family = (device_type, detector)
        with self._lock:
            if self._consumer is None:
                raise RuntimeError("ModelWatcher.start() was not called")
            now = time.monotonic()
            if now - self._last_check >= self.check_interval_s:
                self._last_check = now
                self._drain()
            if family not in self._models or family in self._dirty:
                self._reload(family)
            return self._models[family]

    # --- internals ------------------------------------------------------------------

    def _drain(self) -> None:
        assert self._consumer is not None
        while True:
            messages = self._consumer.consume(num_messages=500, timeout=0)
            if not messages:
                return
            for message in messages:
                if message.error() is not None:
                    log.warning("model-updates topic %s: %s", self.topic, message.error())
                    continue
                try:
                    event = ModelUpdate.from_bytes(message.value() or b"")
                except ValueError as exc:
                    log.warning("ignoring a message on %s: %s", self.topic, exc)
                    continue
                self.events_seen += 1
                self._dirty.add((event.device_type, event.detector))

    def _reload(self, family: Family) -> None:
        self._dirty.discard(family)
        try:
            latest = self.registry.latest_approved(*family)
        except (OSError, ValueError) as exc:
            log.error("cannot read the registry for %s/%s: %s; keeping the current model", *family, exc)
            self._models.setdefault(family, None)
            return
        loaded = self._models.get(family)
        if latest is None:
            self._models[family] = None
            return
        if loaded is not None and loaded[0].version == latest.version:
            return
        try:
            detector = self.registry.load(latest)
        except Exception as exc:
            log.error("cannot load %s/%s version %d: %s; keeping the current model", *family, latest.version, exc)
            self._models.setdefault(family, None)
            return
        self._models[family] = (latest, detector)
        self.reloads += 1
        log.info("model %s/%s now at version %d", *family, latest.version)
