"""``ingestion_gap``: the whole input of a raw topic stopped -- one pipeline incident, not a
silence per device (docs/streaming-internals.md, "Ingestion gaps").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from iotwatch.contract.alerts import AlertLifecycle, AlertRecord, Severity, alert_message, iso_time
from iotwatch.contract.detection import Rule
from iotwatch.settings import Settings
from iotwatch.streaming.alerting import alert_id

log = logging.getLogger(__name__)

#: ``device_type`` of a pipeline incident's alert (its ``device_id`` names the topic).
PIPELINE = "pipeline"
#: ``site`` of the gap of a topic that is no site's replica: the whole cluster.
CLUSTER = "cluster"


@dataclass
class _Topic:
    last_flow_ms: int  # wall time of the last micro-batch that read records of the topic
    expecting: bool  # devices were reporting in that micro-batch
    open: AlertRecord | None = None


class IngestionGaps:
    """The gap state of every raw topic the job reads; :meth:`batch` per micro-batch,
    :meth:`tick` as time passes (also while no micro-batch runs, e.g. Kafka is down)."""

    def __init__(self, settings: Settings, emit: Callable[[AlertRecord], None]) -> None:
        self.gap_ms = int(settings.stream.ingestion_gap_s * 1000)
        self.raw = settings.topics.raw
        self.runbook_url = settings.stream.runbook_url(Rule.INGESTION_GAP)
        self.emit = emit
        self.topics: dict[str, _Topic] = {}
        self.lock = threading.Lock()

    def batch(self, records_by_topic: dict[str, int], devices_reporting: int, now_ms: int) -> None:
        """A micro-batch read ``records_by_topic``; ``devices_reporting``: devices of the
        partitions it touched that neither went silent nor said goodbye."""
        with self.lock:
            for topic, records in records_by_topic.items():
                if records <= 0:
                    continue
                state = self.topics.get(topic)
                if state is not None and state.open is not None:
                    self.emit(self._record(topic, state, AlertLifecycle.CLEARED, now_ms))
                self.topics[topic] = _Topic(now_ms, devices_reporting > 0)

    def tick(self, now_ms: int) -> None:
        """Raise the gap of every topic silent for the gap time while devices were reporting."""
        with self.lock:
            for topic, state in self.topics.items():
                if state.open is None and state.expecting and now_ms - state.last_flow_ms >= self.gap_ms:
                    state.open = self._record(topic, state, AlertLifecycle.RAISED, now_ms)
                    self.emit(state.open)

    def open_gaps(self) -> list[str]:
        with self.lock:
            return [topic for topic, state in self.topics.items() if state.open is not None]

    def _scope(self, topic: str) -> str:
        """The site whose replica ``topic`` is (``<site>.<raw>``), or :data:`CLUSTER`."""
        site, dot, rest = topic.partition(".")
        return site if dot and rest == self.raw else CLUSTER

    def _record(self, topic: str, state: _Topic, lifecycle: AlertLifecycle, now_ms: int) -> AlertRecord:
        scope = self._scope(topic)
        quiet_s = (now_ms - state.last_flow_ms) / 1000
        where = "the whole cluster" if scope == CLUSTER else f"site {scope}"
        if lifecycle is AlertLifecycle.RAISED:
            message = (
                f"no records from {where} ({topic}) for {quiet_s:.0f} s since {iso_time(state.last_flow_ms)}: "
                "the pipeline stopped, not the devices (device silence timers held)"
            )
        else:
            message = f"records from {where} ({topic}) flow again after {quiet_s:.0f} s"
        device_id = f"{PIPELINE}:{topic}"
        return AlertRecord(
            alert_id=alert_id(device_id, Rule.INGESTION_GAP, state.last_flow_ms),
            state=lifecycle,
            severity=Severity.MAJOR,
            rule=Rule.INGESTION_GAP,
            detector=PIPELINE,
            device_id=device_id,
            device_type=PIPELINE,
            site=scope,
            score=1.0,
            first_event_ms=state.last_flow_ms,
            last_event_ms=now_ms,
            detected_at_ms=now_ms,
            message=message,
            runbook_url=self.runbook_url,
        )


class GapAlertWriter:
    """Writes the driver's ``ingestion_gap`` records to the alert topic. Kafka may be the
    very server that is down: the producer keeps them and delivers when it is back. Polled
    all along by a thread of its own, its statistics are how the job learns that a Kafka
    broker it lost answers again (:func:`iotwatch.logs.broker_states`: one line saying so)."""

    #: How often the producer is polled (delivery reports, broker statistics).
    POLL_S = 0.5

    def __init__(self, settings: Settings) -> None:
        from confluent_kafka import Producer

        from iotwatch.clients.kafka import client_config

        self.topic = settings.topics.alerts
        self.producer = Producer(
            {
                **client_config(settings.kafka),
                "enable.idempotence": True,
                "acks": "all",
                "message.timeout.ms": 24 * 3600 * 1000,  # an outage of Kafka is what it reports
            }
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="gap-alert-writer", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.POLL_S):
            self.producer.poll(0)

    def __call__(self, record: AlertRecord) -> None:
        key, value, headers = alert_message(record)
        log.warning("%s %s: %s", record.rule, record.state, record.message)
        self.producer.produce(self.topic, key=key, value=value, headers=list(headers))

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        left = self.producer.flush(timeout_s)
        if left:
            log.warning("%d ingestion_gap record(s) not confirmed by Kafka at exit", left)
