"""A ``format = "record"`` receiver's queue and progress: every raised/cleared alert record
routed to it, one post each, in the alert topic's order. Its progress is its consumer group's
committed offsets (the first record not yet delivered or dead-lettered, per partition), so a
restart resumes there and the group's lag is its backlog (docs/operate/oncall.md, "Following alerts").
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from iotwatch.clients.kafka import client_config, end_offset
from iotwatch.contract.alerts import AlertRecord
from iotwatch.errors import ServiceUnavailable
from iotwatch.settings import Settings

log = logging.getLogger(__name__)

#: A group's coordinator being chosen or loading its offsets: asked again, not an error.
COORDINATOR_NOT_READY = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
)


@dataclass(frozen=True)
class Pending:
    """One alert-topic record waiting for its post (``alert`` None: it does not decode, and is
    dead-lettered with ``detail`` and its bytes, ``raw``, when its turn comes; a decoded one
    keeps no bytes)."""

    seq: int  # arrival order across partitions
    partition: int
    offset: int
    alert: AlertRecord | None
    raw: bytes
    key: bytes | None
    detail: str = ""

    @property
    def where(self) -> str:
        return f"{self.partition}@{self.offset}"


class RecordFeed:
    """The records one receiver has still to get, per partition in offset order, and the
    consumer group offsets that say how far it got."""

    def __init__(self, settings: Settings, receiver: str, group_id: str, from_beginning: bool) -> None:
        self.receiver, self.group_id, self.from_beginning = receiver, group_id, from_beginning
        self.topic = settings.topics.alerts
        self.queues: dict[int, deque[Pending]] = {}
        self.next_offset: dict[int, int] = {}  # after the last record seen, per partition
        self.start: dict[int, int] = {}  # records below were handled by an earlier run
        self.committed: dict[int, int] = {}
        self.failures = 0  # failed posts of the record at the head
        self.retry_at_ms = 0  # ... not tried again before this
        self.commit_failures = 0
        self.duplicates = 0  # records skipped: the alert topic held the same alert and state before
        self._seq = 0
        self._group = Consumer(
            {**client_config(settings.kafka), "group.id": group_id, "enable.auto.commit": False}
        )  # commits only: it never subscribes, so it takes no partitions from anyone

    def begin(self, partitions: int) -> None:
        """Where the group left off; a group with nothing committed starts at the oldest
        retained record, or (``from_beginning`` False) at the end of the topic now."""
        committed = self._committed(partitions)
        for tp in committed:
            if tp.offset >= 0:
                start = tp.offset
            elif self.from_beginning:
                start = 0
            else:
                start = end_offset(self._group, TopicPartition(self.topic, tp.partition), timeout_s=10)
            self.start[tp.partition] = start
            self.committed[tp.partition] = tp.offset
        log.info(
            "receiver %s resumes consumer group %s at %s",
            self.receiver,
            self.group_id,
            ", ".join(f"{p}@{o}" for p, o in sorted(self.start.items())) or "the topic's creation",
        )

    def _committed(self, partitions: int, timeout_s: float = 30.0) -> list[TopicPartition]:
        """The group's committed offsets; a group's coordinator that is still being chosen or
        loaded (``NOT_COORDINATOR``, ``COORDINATOR_LOAD_IN_PROGRESS``: retriable) is asked again."""
        wanted = [TopicPartition(self.topic, p) for p in range(partitions)]
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return list(self._group.committed(wanted, timeout=max(1.0, deadline - time.monotonic())))
            except KafkaException as exc:
                error = exc.args[0]
                if not (error.retriable() or error.code() in COORDINATOR_NOT_READY) or time.monotonic() >= deadline:
                    raise ServiceUnavailable(f"consumer group {self.group_id}: {error.str()}") from exc
                time.sleep(0.2)

    def offer(self, pending: Pending, routed: bool, repeat: bool) -> None:
        """A record read from the alert topic; queued when routed to this receiver, not handled
        by an earlier run and not a ``repeat`` of a record the topic held before (the same
        alert and state, e.g. written again by a producer's retry)."""
        self.next_offset[pending.partition] = pending.offset + 1
        if not routed or pending.offset < self.start.get(pending.partition, 0):
            return
        if repeat:
            self.duplicates += 1
            log.debug("%s at %s is a repeat: skipped", pending.alert and pending.alert.alert_id, pending.where)
            return
        self.queues.setdefault(pending.partition, deque()).append(pending)

    def pending(
        self, partition: int, offset: int, alert: AlertRecord | None, raw: bytes, key: bytes | None, detail: str = ""
    ) -> Pending:
        self._seq += 1
        return Pending(self._seq, partition, offset, alert, raw if alert is None else b"", key, detail)

    def head(self) -> Pending | None:
        """The oldest record still to post."""
        heads = [queue[0] for queue in self.queues.values() if queue]
        return min(heads, key=lambda p: p.seq) if heads else None

    def waiting(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    def done(self, pending: Pending) -> None:
        """The head's outcome is final: drop it and commit the partition's new position."""
        self.queues[pending.partition].popleft()
        self.failures, self.retry_at_ms = 0, 0
        self.commit()

    def commit(self) -> None:
        """Commit every partition whose first unhandled record moved on (records not routed
        here move it too)."""
        self._group.poll(0)  # serves the client's error and log events (it reads no records)
        offsets = []
        for partition, after_last in self.next_offset.items():
            queue = self.queues.get(partition)
            position = queue[0].offset if queue else after_last
            if position > self.committed.get(partition, -1):
                offsets.append(TopicPartition(self.topic, partition, position))
        if not offsets:
            return
        try:
            self._group.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:  # Kafka away: the next outcome commits again; a restart resends at most these
            self.commit_failures += 1
            log.warning("consumer group %s: commit failed (%s); trying again with the next record", self.group_id, exc)
            return
        for tp in offsets:
            self.committed[tp.partition] = tp.offset

    def close(self) -> None:
        self._group.close()
