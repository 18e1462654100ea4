"""The dead-letter topic, read back for operators: what was refused, why, from which device, and a
replay of chosen records to the raw topic once the cause is fixed (docs/internals.md, "Dead letters
read back")."""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import KafkaError, Message, Producer

from iotwatch.clients.kafka import client_config, read_to_end
from iotwatch.contract.dead_letters import H_INGEST_MS, H_MQTT_TOPIC, DeadLetter, header_value
from iotwatch.contract.metric_catalog import KNOWN_METRICS
from iotwatch.contract.telemetry import ContractViolation, decode_telemetry
from iotwatch.errors import IotwatchError, ServiceUnavailable
from iotwatch.settings import Settings

#: Header of a replayed reading: the dead letter it came from (``<dlq topic>:PARTITION:OFFSET``).
H_REPLAY_OF = "iotwatch.replay_of"
#: Bytes of a record's value shown as its excerpt.
EXCERPT_CHARS = 240


@dataclass(frozen=True)
class StoredDeadLetter:
    """A dead letter and where it is on the topic."""

    partition: int
    offset: int
    letter: DeadLetter
    dead_at_ms: int | None
    kafka_ms: int

    @property
    def record_id(self) -> str:
        return f"{self.partition}:{self.offset}"

    @property
    def device(self) -> str:
        return self.letter.key.decode(errors="replace") if self.letter.key else "-"

    @property
    def at_ms(self) -> int:
        return self.dead_at_ms or self.kafka_ms

    def excerpt(self, chars: int = EXCERPT_CHARS) -> str:
        """The value as text, cut to ``chars`` (bytes that are not UTF-8 shown escaped)."""
        text = self.letter.original.decode("utf-8", "backslashreplace")
        return text if len(text) <= chars else f"{text[:chars]}… ({len(self.letter.original):,} bytes)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.record_id,
            "reason": self.letter.reason,
            "stage": self.letter.stage,
            "device": self.device,
            "detail": self.letter.detail,
            "mqtt_topic": self.letter.mqtt_topic,
            "dead_at_ms": self.at_ms,
            "bytes": len(self.letter.original),
            "excerpt": self.excerpt(),
        }


def read_dead_letters(settings: Settings, timeout_s: float = 60.0) -> tuple[list[StoredDeadLetter], int]:
    """Every record of the dead-letter topic, oldest first, and how many of them are not dead
    letters (no reason header)."""
    letters, unreadable = [], 0
    for message in read_to_end(settings.kafka, settings.topics.dlq, timeout_s):
        try:
            letters.append(_stored(message))
        except ValueError:
            unreadable += 1
    letters.sort(key=lambda s: (s.at_ms, s.partition, s.offset))
    return letters, unreadable


def _note_failure(failures: list[str], record_id: str, err: KafkaError | None, _msg: Message) -> None:
    """A delivery report: the replayed record ``record_id`` that Kafka did not confirm."""
    if err is not None:
        failures.append(record_id)


def _stored(message: Message) -> StoredDeadLetter:
    # a consumed record's headers are (name, bytes) pairs; a partition and an offset it has
    headers = cast(list[tuple[str, bytes | None]] | None, message.headers())
    partition, offset = message.partition(), message.offset()
    assert partition is not None and offset is not None
    letter = DeadLetter.of_message(message.value(), message.key(), headers)
    dead_at = header_value(headers, "iotwatch.dead_at_ms")
    return StoredDeadLetter(
        partition,
        offset,
        letter,
        int(dead_at) if dead_at and dead_at.isdigit() else None,
        message.timestamp()[1],
    )


@dataclass(frozen=True)
class Selection:
    """Which dead letters an operator means: ids, or matchers (every one given must match)."""

    ids: frozenset[str] = frozenset()
    reasons: frozenset[str] = frozenset()
    devices: frozenset[str] = frozenset()
    stages: frozenset[str] = frozenset()
    since_ms: int | None = None

    def matches(self, stored: StoredDeadLetter) -> bool:
        return (
            (not self.ids or stored.record_id in self.ids)
            and (not self.reasons or stored.letter.reason in self.reasons)
            and (not self.devices or stored.device in self.devices)
            and (not self.stages or stored.letter.stage in self.stages)
            and (self.since_ms is None or stored.at_ms >= self.since_ms)
        )

    def pick(self, letters: Iterable[StoredDeadLetter]) -> list[StoredDeadLetter]:
        chosen = [s for s in letters if self.matches(s)]
        missing = self.ids - {s.record_id for s in chosen}
        if missing:
            raise IotwatchError(
                f"no dead letter {', '.join(sorted(missing))} on the topic (ids are PARTITION:OFFSET, "
                "as `iotwatch deadletters show` prints them)"
            )
        return chosen


@dataclass
class Group:
    """Dead letters of one reason, stage and device."""

    reason: str
    stage: str
    device: str
    count: int = 0
    first_ms: int = 0
    last_ms: int = 0
    last_id: str = ""
    detail: str = ""


def grouped(letters: Sequence[StoredDeadLetter]) -> list[Group]:
    """By reason, stage and device; the largest group first, the newest detail of each kept."""
    groups: dict[tuple[str, str, str], Group] = {}
    for stored in letters:  # oldest first
        key = (stored.letter.reason, stored.letter.stage, stored.device)
        group = groups.get(key) or groups.setdefault(key, Group(*key, first_ms=stored.at_ms))
        group.count += 1
        group.last_ms, group.last_id, group.detail = stored.at_ms, stored.record_id, stored.letter.detail
    return sorted(groups.values(), key=lambda g: (-g.count, g.reason, g.device))


@dataclass
class ReplayResult:
    """What a replay did: the ids produced to the raw topic, and the ones still refused (with
    the reason the contract gives now)."""

    replayed: list[str] = field(default_factory=list)
    still_invalid: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "replayed": len(self.replayed),
            "still_invalid": len(self.still_invalid),
            "still_invalid_reasons": dict(Counter(self.still_invalid.values())),
            "replayed_ids": self.replayed,
            "still_invalid_ids": self.still_invalid,
        }


def replay(settings: Settings, chosen: Sequence[StoredDeadLetter], *, dry_run: bool = False) -> ReplayResult:
    """Produce the chosen dead letters that the contract accepts now to the raw topic (key the
    device id, the MQTT topic and the dead letter's place as headers) and wait for Kafka to
    confirm them; the others are reported, not produced."""
    result = ReplayResult()
    accepted = []
    now_ms = int(time.time() * 1000)
    for stored in chosen:
        try:
            reading = decode_telemetry(stored.letter.original, now_ms=now_ms, metrics_of=KNOWN_METRICS)
        except ContractViolation as exc:
            result.still_invalid[stored.record_id] = exc.reason
            continue
        accepted.append((stored, reading.key()))
    if dry_run or not accepted:
        result.replayed = [stored.record_id for stored, _key in accepted]
        return result
    producer = Producer({**client_config(settings.kafka), "enable.idempotence": True, "linger.ms": 5})
    failures: list[str] = []
    for stored, key in accepted:
        headers: list[tuple[str, str | bytes | None]] = [
            (H_REPLAY_OF, f"{settings.topics.dlq}:{stored.record_id}".encode()),
            (H_INGEST_MS, str(now_ms).encode()),
        ]
        if stored.letter.mqtt_topic:
            headers.append((H_MQTT_TOPIC, stored.letter.mqtt_topic.encode()))
        producer.produce(
            settings.topics.raw,
            stored.letter.original,
            key=key,
            headers=headers,
            on_delivery=functools.partial(_note_failure, failures, stored.record_id),
        )
    if producer.flush(30.0) > 0 or failures:
        raise ServiceUnavailable(f"Kafka did not confirm replayed records on {settings.topics.raw}")
    result.replayed = [stored.record_id for stored, _key in accepted]
    return result
