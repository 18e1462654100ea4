"""A run's progress, once a second: the stage counters every scenario watches (docs/internals.md,
"Harness probe")."""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from iotwatch.clients.kafka import client_config, end_offset
from iotwatch.contract.alerts import AlertRecord, BadAlert, decode_alert
from iotwatch.gateway.metrics import scrape
from iotwatch.settings import KafkaSettings, Settings
from iotwatch.streaming.checkpoint import batch_ids

log = logging.getLogger(__name__)

#: The gateway counters a sample keeps (the live view, the report's plots and the drain check
#: read them); an hour's run samples every second, so the rest of the gateway's metrics are
#: left to its own final report.
GATEWAY_COUNTERS = ("received", "forwarded", "dead_lettered", "inflight", "kafka_up")


@dataclass(slots=True)
class Sample:
    t: float
    gateway: dict[str, float]  # GATEWAY_COUNTERS, summed over the gateways
    raw_end: int
    stream_offset: int
    alerts: int
    #: with sites: the raw topics' ends at the sites (``raw_end`` is their replicas' at the centre)
    edge_end: int = 0


@dataclass
class LiveState:
    """Samples over time (for the report's rate plot) and the latest alerts."""

    samples: list[Sample] = field(default_factory=list)
    recent_alerts: deque[AlertRecord] = field(default_factory=lambda: deque(maxlen=8))
    alerts_seen: int = 0


#: Seconds a probe's Kafka client may go without an answer before it is replaced: a client
#: can stay unanswered after a paused broker is back while another client of the same
#: process is answered, and a chaos run's recovery check would then see no new record.
STALE_CLIENT_S = 10.0


class Probe:
    """Reads the current counters of every stage."""

    def __init__(
        self,
        settings: Settings,
        gateway_ports: list[int],
        checkpoint: Path,
        raw_topics: list[str] | None = None,
        edges: list[KafkaSettings] | None = None,
    ) -> None:
        """``raw_topics``: the raw topics the job reads at the centre (default the raw topic);
        ``edges``: the sites' clusters, whose raw topics feed them."""
        self.settings = settings
        self.gateway_urls = [f"http://127.0.0.1:{port}/metrics" for port in gateway_ports]
        self.checkpoint = checkpoint
        config = {**client_config(settings.kafka), "enable.auto.commit": False}
        self.alerts = Consumer({**config, "group.id": "demo-live-alerts"})
        partitions = settings.kafka.partitions
        self.raw = LogEnd(
            {**config, "group.id": "demo-live-offsets"},
            [TopicPartition(topic, p) for topic in (raw_topics or [settings.topics.raw]) for p in range(partitions)],
        )
        self.edges = [
            LogEnd(
                {**client_config(edge), "enable.auto.commit": False, "group.id": "demo-live-offsets"},
                [TopicPartition(settings.topics.raw, p) for p in range(partitions)],
            )
            for edge in edges or []
        ]
        self.alerts.assign([TopicPartition(settings.topics.alerts, p, OFFSET_BEGINNING) for p in range(partitions)])

    def close(self) -> None:
        self.raw.close()
        self.alerts.close()
        for edge in self.edges:
            edge.close()

    def gateway(self) -> dict[str, float]:
        """Every gateway's :data:`GATEWAY_COUNTERS`, summed (``kafka_up``: the gateways that
        reach Kafka), and ``answered``: the gateways that answered this second (one that does
        not adds nothing this time)."""
        values: dict[str, float] = {"answered": 0.0}
        for url in self.gateway_urls:
            scraped = scrape(url)
            values["answered"] += bool(scraped)
            for key, value in scraped.items():
                if key in GATEWAY_COUNTERS:
                    values[key] = values.get(key, 0.0) + value
        return values

    def raw_end(self) -> int:
        """The raw topics' end offsets at the centre, summed (see :class:`LogEnd`)."""
        return self.raw.total()

    def edge_end(self) -> int:
        """The sites' raw topics' end offsets, summed."""
        return sum(edge.total() for edge in self.edges)

    def stream_offset(self) -> int:
        """Records the job has finished (all sinks written): the end offsets of the newest
        batch that has a commit file in its checkpoint."""
        done = batch_ids(self.checkpoint, "commits")
        if not done:
            return 0
        batch = self.checkpoint / "offsets" / str(done[-1])
        if not batch.exists():
            return 0
        last_line = batch.read_text().strip().splitlines()[-1]
        try:
            offsets = json.loads(last_line)
        except ValueError:
            return 0
        return sum(int(o) for partitions in offsets.values() for o in partitions.values())

    def new_alerts(self) -> list[AlertRecord]:
        out = []
        for message in self.alerts.consume(500, 0.05):
            if message.error() is None:
                try:
                    out.append(decode_alert(message.value()))
                except BadAlert:
                    continue  # the report counts what the topic holds; the live view shows alerts
        return out

    def sample(self, state: LiveState) -> Sample:
        for alert in self.new_alerts():
            state.alerts_seen += 1
            state.recent_alerts.appendleft(alert)
        sample = Sample(
            time.time(), self.gateway(), self.raw_end(), self.stream_offset(), state.alerts_seen, self.edge_end()
        )
        state.samples.append(sample)
        return sample


class LogEnd:
    """The summed end offsets of some partitions, read with a client of their own.

    A partition Kafka does not answer for within a second (it is restarting) counts with its
    last known end. A client that goes :data:`STALE_CLIENT_S` without any answer is replaced:
    it can stay unanswered after a paused broker is back, while other clients are answered."""

    def __init__(self, config: dict[str, Any], partitions: list[TopicPartition]) -> None:
        self.config = config
        self.partitions = partitions
        self.consumer = Consumer(config)
        self._known: dict[tuple[str, int], int] = {}
        self._unanswered_since: float | None = None

    def total(self) -> int:
        answered = False
        for tp in self.partitions:
            try:
                self._known[(tp.topic, tp.partition)] = end_offset(self.consumer, tp)
                answered = True
            except KafkaException as exc:
                log.debug("live view: no end offset of %s [%d]: %s", tp.topic, tp.partition, exc)
        now = time.monotonic()
        if answered:
            self._unanswered_since = None
        elif self._unanswered_since is None:
            self._unanswered_since = now
        elif now - self._unanswered_since > STALE_CLIENT_S:
            log.warning("no end offset of %s for %.0f s: asking with a new Kafka client", self.topics, STALE_CLIENT_S)
            self.consumer.close()
            self.consumer = Consumer(self.config)
            self._unanswered_since = None
        return sum(self._known.get((tp.topic, tp.partition), 0) for tp in self.partitions)

    @property
    def topics(self) -> str:
        return ", ".join(sorted({tp.topic for tp in self.partitions}))

    def close(self) -> None:
        self.consumer.close()
