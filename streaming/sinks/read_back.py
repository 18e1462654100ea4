"""The original bytes of decoded records, read back from the log by offset for their dead
letters (docs/streaming-internals.md, "Read-back of dead letters").
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from iotwatch.streaming.operator_key import source_partition

#: Wanted offsets closer than this are read through in one pass rather than seeked to each.
READ_THROUGH_RECORDS = 2_000
#: How long one read-back may take before the records not found get no bytes.
READ_BACK_TIMEOUT_S = 30.0
#: The consumer's group (never joined, nothing committed): the streaming user's ACLs grant its prefix.
READ_BACK_GROUP = "iotwatch-stream-read-back"


def offset_runs(offsets: Iterable[int], gap: int = READ_THROUGH_RECORDS) -> list[tuple[int, int]]:
    """Sorted distinct ``offsets`` as inclusive ``(first, last)`` runs, a new run where the next
    offset is ``gap`` or more past the last."""
    runs: list[tuple[int, int]] = []
    for offset in sorted(set(offsets)):
        if runs and offset - runs[-1][1] < gap:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


class LogReader:
    """Reads single records of a topic partition by offset; one consumer per Python worker
    task, made on first use and kept (dead letters of decoded records are rare)."""

    def __init__(self, kafka_config: Mapping[str, str]) -> None:
        self._config = dict(kafka_config)
        self._consumer: Any = None

    def values(
        self, topic: str, partition: int, offsets: Iterable[int], timeout_s: float = READ_BACK_TIMEOUT_S
    ) -> dict[int, bytes]:
        """The values at ``offsets`` of ``topic``/``partition``; offsets no longer in the log
        (or not read within ``timeout_s``) are left out."""
        consumer = self._consumer_once()
        wanted = set(offsets)
        found: dict[int, bytes] = {}
        deadline = time.monotonic() + timeout_s
        for first, last in offset_runs(wanted):
            consumer.assign([TopicPartition(topic, partition, first)])
            position = first
            while position <= last and time.monotonic() < deadline:
                for message in consumer.consume(min(last - position + 1, 5000), 1.0):
                    error = message.error()
                    if error is None:
                        offset = message.offset()
                        position = offset + 1
                        if offset in wanted:
                            found[offset] = message.value() or b""
                    elif error.code() == KafkaError._PARTITION_EOF or not error.retriable():
                        position = last + 1  # the log ends before them, or retention deleted them
        consumer.unassign()
        return found

    def _consumer_once(self) -> Any:
        if self._consumer is None:
            self._consumer = Consumer(
                {
                    **self._config,
                    "group.id": READ_BACK_GROUP,
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    # an offset deleted by retention is an error here, never a jump elsewhere
                    "auto.offset.reset": "error",
                    # a run is a few thousand records: do not prefetch the partition's backlog
                    "queued.max.messages.kbytes": 4096,
                    "fetch.wait.max.ms": 50,
                }
            )
        return self._consumer


def _source(row: dict[str, Any]) -> tuple[str, int, int] | None:
    """Where a dead-letter row's record is in the log, when its bytes are to be read back."""
    if row["raw"] is not None or not row.get("kafka_topic"):
        return None
    return row["kafka_topic"], source_partition(row["kafka_partition"]), row["kafka_offset"]


def with_original_bytes(reader: LogReader, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Dead-letter rows of the engine, those without ``raw`` given their record's bytes from
    the log (in their ``kafka_topic``, at their partition and offset)."""
    sources = [_source(row) for row in rows]
    missing: dict[tuple[str, int], list[int]] = {}
    for source in sources:
        if source is not None:
            missing.setdefault(source[:2], []).append(source[2])
    if not missing:
        return rows
    values = {
        (topic, partition, offset): value
        for (topic, partition), offsets in missing.items()
        for offset, value in reader.values(topic, partition, offsets).items()
    }
    out = []
    for row, source in zip(rows, sources, strict=True):
        if source in values:
            row = {**row, "raw": values[source]}
        elif source is not None:
            row = {**row, "detail": f"{row['detail']} (its bytes are no longer in {source[0]})"}
        out.append(row)
    return out
