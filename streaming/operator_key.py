"""The stateful operator's grouping key: a Kafka partition, salted so that the partitions
spread evenly over the operator's tasks (docs/streaming-internals.md, "The grouping key").
"""

from __future__ import annotations

import zlib
from functools import lru_cache
from typing import Any

#: The packed rows' grouping column.
OPERATOR_KEY = "operator_key"
_PARTITION_BITS = 32
_MASK32 = 0xFFFFFFFF
#: Spark's seed for ``hash()`` and hash partitioning.
_SPARK_HASH_SEED = 42


def _rotl32(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK32


def _mix(h1: int, word: int) -> int:
    k1 = _rotl32((word * 0xCC9E2D51) & _MASK32, 15) * 0x1B873593 & _MASK32
    h1 = _rotl32(h1 ^ k1, 13)
    return (h1 * 5 + 0xE6546B64) & _MASK32


def spark_hash_long(value: int) -> int:
    """Spark's ``hash()`` of a LONG value (``Murmur3_x86_32.hashLong``, seed 42), signed."""
    h1 = _mix(_mix(_SPARK_HASH_SEED, value & _MASK32), (value >> 32) & _MASK32) ^ 8
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


#: Bits of a Kafka partition number in a stream partition of a topic other than the raw topic.
_TOPIC_SHIFT = 16


@lru_cache(maxsize=4096)
def stream_partition(topic: str, partition: int, home_topic: str | None) -> int:
    """The job's number for a Kafka partition: the partition itself in the raw topic
    (``home_topic``), and in any other topic the job reads by pattern (each site's replica)
    ``t << 16 | partition`` with ``t`` in 1..32767 from the topic's CRC-32, so partition 0 of
    two sites' topics are two partitions to the job, each with its own state and archive files."""
    if topic == home_topic or home_topic is None:
        return partition
    return ((zlib.crc32(topic.encode()) % 32767) + 1) << _TOPIC_SHIFT | partition


def source_partition(partition: int) -> int:
    """The Kafka partition, in its own topic, of a job's partition number (:func:`stream_partition`)."""
    return partition & (1 << _TOPIC_SHIFT) - 1


@lru_cache(maxsize=4096)
def operator_key(partition: int, tasks: int) -> int:
    """``salt << 32 | partition`` with the smallest salt for which Spark places the key on
    task ``partition mod tasks`` (found within ``tasks * 64`` tries all but never: salt 0
    then, unbalanced but never wrong)."""
    for salt in range(max(1, tasks) * 64):
        key = (salt << _PARTITION_BITS) | partition
        if spark_hash_long(key) % tasks == partition % tasks:  # Python's % is Spark's pmod here
            return key
    return partition


def partition_of(key: Any) -> int:
    """The Kafka partition an operator key (a grouping-key tuple or the number) stands for."""
    value = key[0] if isinstance(key, tuple | list) else key
    return int(value) & _MASK32
