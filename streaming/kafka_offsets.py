"""Kafka offset bookkeeping for the ``iotwatch-kafka`` Spark source (driver side).

Kept apart from the Spark classes so the arithmetic (offset JSON, per-trigger limits,
range splitting) is plain Python, and so the one piece that talks to the broker about
offsets, :class:`OffsetClient`, is small enough to reason about.

Why :class:`OffsetClient` does not simply trust ``get_watermark_offsets()``: the embedded
broker (Tansu) answers ListOffsets(latest) with the base offset of the *last record
batch* + 1 instead of the log end, so a batch of 1 000 records may be reported as 1
record. The high watermark in a Fetch response is right on every broker, so the client
confirms each reported end with one short fetch (see :meth:`OffsetClient.log_ends`).
On Apache Kafka the reported end is already exact and the fetch comes back empty with
``_PARTITION_EOF`` after ``fetch.wait.max.ms``; the extra cost is one round trip.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

log = logging.getLogger(__name__)

TP = tuple[str, int]  # (topic, partition)
EARLIEST, LATEST = -2, -1  # the markers Spark's connector uses in startingOffsets JSON

# Properties the source sets itself: a user value would break its guarantees.
_OWNED = {"enable.auto.commit", "enable.partition.eof", "auto.offset.reset"}


class KafkaDataLossError(RuntimeError):
    """Records the checkpoint says are next to read are no longer on the broker."""


def client_config(options: Mapping[str, str]) -> dict[str, str]:
    """librdkafka properties from the ``kafka.*`` options (prefix removed), like Spark's
    connector passes ``kafka.*`` to its Java consumer."""
    config = {k[len("kafka.") :]: str(v) for k, v in options.items() if k.lower().startswith("kafka.")}
    if "bootstrap.servers" not in config:
        raise ValueError("option 'kafka.bootstrap.servers' is required")
    for key in _OWNED & config.keys():
        log.warning("ignoring option kafka.%s: the iotwatch-kafka source sets it itself", key)
        del config[key]
    config.setdefault("group.id", f"iotwatch-kafka-source-{uuid.uuid4().hex[:8]}")  # never joined: assign() only
    # Spark's connector (Java client) reads uncommitted records by default; librdkafka does not.
    config.setdefault("isolation.level", "read_uncommitted")
    return config


def to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """``{(topic, p): n}`` -> ``{topic: {"p": n}}``, the form kept in Spark's checkpoint."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def from_json(offsets: Mapping[str, Mapping[str, int]] | None) -> dict[TP, int]:
    return {(topic, int(p)): int(o) for topic, parts in (offsets or {}).items() for p, o in parts.items()}


def parse_offsets_option(value: str | None, default: str) -> str | dict[TP, int]:
    """``earliest`` | ``latest`` | JSON ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest)."""
    value = (value or default).strip()
    if value.lower() in ("earliest", "latest"):
        return value.lower()
    try:
        parsed = json.loads(value)
        return from_json(parsed)
    except (ValueError, AttributeError, TypeError) as exc:
        raise ValueError(
            f'offsets option must be earliest, latest or JSON like {{"topic":{{"0":23,"1":-2}}}}, got {value!r}'
        ) from exc


def fair_share(backlog: Mapping[TP, int], limit: int) -> dict[TP, int]:
    """Split ``limit`` records over partitions by max-min fairness.

    Every partition with a backlog gets an equal share, capped at its backlog; what a
    small partition cannot use goes to the others. Unlike a split proportional to the
    backlog, a partition with a few records is never starved by one with millions, and
    the total is exactly ``min(limit, sum(backlog))``. Leftover units after integer
    division go to the largest backlogs first (ties by name), deterministically.
    """
    share = dict.fromkeys(backlog, 0)
    left = max(0, limit)
    open_ = sorted((tp for tp, n in backlog.items() if n > 0), key=lambda tp: (-backlog[tp], tp))
    while left > 0 and open_:
        each = left // len(open_)
        if each == 0:  # fewer units than partitions: one each to the biggest backlogs
            for tp in open_[:left]:
                share[tp] += 1
            break
        still_open = []
        for tp in open_:
            take = min(each, backlog[tp] - share[tp])
            share[tp] += take
            left -= take
            if share[tp] < backlog[tp]:
                still_open.append(tp)
        open_ = still_open
    return share


def split_ranges(
    ranges: list[tuple[str, int, int, int]], min_partitions: int | None
) -> list[tuple[str, int, int, int]]:
    """Cut ``(topic, partition, start, end)`` ranges so there are about ``min_partitions``,
    big ranges into proportionally more pieces (as Spark's connector does), so one busy
    Kafka partition can still be read by several tasks."""
    total = sum(end - start for _, _, start, end in ranges)
    if not min_partitions or min_partitions <= len(ranges) or total == 0:
        return ranges
    out = []
    for topic, partition, start, end in ranges:
        parts = max(1, round((end - start) / total * min_partitions))
        bounds = [start + (end - start) * i // parts for i in range(parts + 1)]
        out += [(topic, partition, a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    return out


def group_ranges(
    ranges: list[tuple[str, int, int, int]], max_groups: int | None
) -> list[list[tuple[str, int, int, int]]]:
    """Ranges in at most ``max_groups`` groups of about equal size (largest first, each to
    the smallest group so far), so a micro-batch with more moving partitions than cores is
    read by one task per core rather than in waves of tasks that each cost a set-up."""
    if not max_groups or len(ranges) <= max_groups:
        return [[r] for r in ranges]
    groups: list[list[tuple[str, int, int, int]]] = [[] for _ in range(max_groups)]
    sizes = [0] * max_groups
    for r in sorted(ranges, key=lambda r: r[2] - r[3]):
        smallest = sizes.index(min(sizes))
        groups[smallest].append(r)
        sizes[smallest] += r[3] - r[2]
    return [sorted(g) for g in groups if g]


class OffsetClient:
    """Partition discovery, earliest offsets and confirmed log ends, for the driver.

    Two consumers are created lazily and reused between calls (a trigger every few
    hundred ms must not reconnect each time); :meth:`close` releases them. Nothing is
    created in ``__init__`` so the owning reader stays picklable.
    """

    def __init__(self, config: Mapping[str, str], timeout_s: float = 10.0, probe_timeout_s: float = 2.0) -> None:
        self._config = {"group.id": "iotwatch-kafka-offsets", **config}  # required, never joined
        self._timeout_s = timeout_s
        self._probe_timeout_s = probe_timeout_s
        self._meta: Consumer | None = None
        self._probe: Consumer | None = None
        self._confirmed: dict[TP, int] = {}  # highest end seen in a fetch: a good place to probe from

    def _metadata_consumer(self) -> Consumer:
        if self._meta is None:
            self._meta = Consumer({**self._config, "enable.auto.commit": False})
        return self._meta

    def _probe_consumer(self) -> Consumer:
        if self._probe is None:
            self._probe = Consumer(
                {
                    **self._config,
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "auto.offset.reset": "latest",
                    "fetch.wait.max.ms": 10,
                    "max.partition.fetch.bytes": 65536,
                    "fetch.max.bytes": 1048576,
                }
            )
        return self._probe

    def partitions(self, topics: Iterable[str]) -> list[TP]:
        """Current partitions of ``topics``; a missing topic has none (yet)."""
        found: list[TP] = []
        for topic in topics:
            meta = self._metadata_consumer().list_topics(topic, timeout=self._timeout_s)
            info = meta.topics.get(topic)
            if info is None or info.error is not None:
                if info is not None and info.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise KafkaException(info.error)
                continue
            found += [(topic, p) for p in sorted(info.partitions)]
        return found

    def watermarks(self, tps: Iterable[TP]) -> dict[TP, tuple[int, int]]:
        """``(low, reported high)`` per partition; the high may be short on Tansu.

        Retried twice (like the connector's ``fetchOffset.numRetries``) so one broker
        hiccup, e.g. a leader moving, does not fail the whole query."""
        consumer, tps = self._metadata_consumer(), list(tps)
        for attempt in range(3):
            try:
                return {tp: consumer.get_watermark_offsets(TopicPartition(*tp), timeout=self._timeout_s) for tp in tps}
            except KafkaException as exc:
                if attempt == 2:
                    raise
                log.warning("listing offsets failed (%s); retrying", exc)
                time.sleep(1.0)
        raise AssertionError("unreachable")

    def log_ends(self, tps: Iterable[TP], floor: Mapping[TP, int] | None = None) -> tuple[dict[TP, int], dict[TP, int]]:
        """``(earliest, log end)`` per partition, the end confirmed by a fetch.

        The probe consumer is assigned at ``max(reported high, last confirmed end)``.
        The first event per partition - a record or ``_PARTITION_EOF`` - means a Fetch
        response arrived, whose high watermark librdkafka caches. If the probe gets no
        answer in time the reported value is used, raised to ``floor`` (the offsets already
        read): an unconfirmed short answer must not look like lost data. It is never
        larger than the truth, so nothing is skipped; a later trigger gets the rest.
        """
        marks = self.watermarks(tps)
        lows = {tp: low for tp, (low, _) in marks.items()}
        ends = {tp: high for tp, (_, high) in marks.items()}
        if not marks:
            return lows, ends
        probe = self._probe_consumer()
        starts = {tp: max(ends[tp], self._confirmed.get(tp, -1)) for tp in marks}
        probe.assign([TopicPartition(t, p, starts[(t, p)] if starts[(t, p)] >= 0 else OFFSET_END) for t, p in marks])
        pending = set(marks)
        deadline = time.monotonic() + self._probe_timeout_s
        try:
            while pending and time.monotonic() < deadline:
                for msg in probe.consume(500, 0.01):
                    tp = (msg.topic(), msg.partition())
                    if tp not in pending:
                        continue
                    err = msg.error()
                    if err is not None and err.code() != KafkaError._PARTITION_EOF:
                        log.debug("log-end probe of %s: %s", tp, err)
                        continue
                    _, high = probe.get_watermark_offsets(TopicPartition(*tp), cached=True)
                    if err is None:  # a record: the log reaches past it, whatever the cached mark says
                        high = max(high, ends[tp], msg.offset() + 1)
                    if high >= 0:
                        ends[tp] = high
                        self._confirmed[tp] = ends[tp]
                    pending.discard(tp)
        finally:
            probe.unassign()  # stop prefetching records nobody will read
        for tp in pending:
            ends[tp] = max(ends[tp], (floor or {}).get(tp, -1), self._confirmed.get(tp, -1))
        if pending:
            log.info(
                "log-end probe got no fetch answer for %s within %.1fs; using ListOffsets values",
                sorted(pending),
                self._probe_timeout_s,
            )
        return lows, ends

    def close(self) -> None:
        for consumer in (self._meta, self._probe):
            if consumer is not None:
                try:
                    consumer.close()
                except (KafkaException, RuntimeError):
                    pass
        self._meta = self._probe = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_meta": None, "_probe": None}
