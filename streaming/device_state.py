"""The per-device state the streaming job keeps in Spark's state store: a few arrays of numbers.

One value per device (a ``MapState`` entry under the device's Kafka partition), with a
documented fixed layout and no JSON or pickles, so loading and saving a device costs a few
``numpy.frombuffer``/``tobytes`` calls:

- ``core`` (int64, :data:`CORE_FIELDS`): sequence high-water mark, newest event time,
  wall and log times of the newest record, the accounting counters;
- ``seqs`` (uint64 words): a ring bitmap of the last ``dedup_window`` seqs, bit
  ``seq % window`` (duplicate detection);
- ``episodes`` (int64, one row per non-idle rule, :data:`EPISODE_FIELDS`) and their peak
  scores (float64): the alert lifecycle (idle rules keep nothing);
- ``metrics`` (names) with one detector state row each (float64, in the layout of the
  device detector's kernel, see :mod:`iotwatch.models.kernels`) and the metric's previous value
  (the fleet model's change features);
- ``buckets`` (float64 rows, :data:`BUCKET_FIELDS`): open event-time aggregates.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

#: int64 fields of ``DeviceState.core``, by position.
CORE_FIELDS = (
    "seq_high",
    "max_event_ms",
    "last_wall_ms",
    "last_append_ms",
    "received",
    "scored",
    "duplicates",
    "late",
    "dead_lettered",
    "seq_resets",
    "clock_steps",
    "seq_gaps",
)
(
    SEQ_HIGH,
    MAX_EVENT_MS,
    LAST_WALL_MS,
    LAST_APPEND_MS,
    RECEIVED,
    SCORED,
    DUPLICATES,
    LATE,
    DEAD_LETTERED,
    SEQ_RESETS,
    CLOCK_STEPS,
    SEQ_GAPS,
) = range(len(CORE_FIELDS))
#: Counters summed into the job's totals (a subset of CORE_FIELDS).
COUNTERS = CORE_FIELDS[RECEIVED:]

#: int64 fields of one episode row (the alert lifecycle of one rule of one device); ``metric``
#: is the index in ``DeviceState.metrics`` of the metric the alert was raised on (-1: none),
#: so its clear speaks of the same metric.
EPISODE_FIELDS = ("rule", "status", "above", "below", "start_ms", "start_seq", "last_ms", "occurrences", "metric")
EP_RULE, EP_STATUS, EP_ABOVE, EP_BELOW, EP_START_MS, EP_START_SEQ, EP_LAST_MS, EP_OCCURRENCES, EP_METRIC = range(
    len(EPISODE_FIELDS)
)
IDLE, PENDING, OPEN = 0, 1, 2

#: float64 fields of one open aggregate bucket of one metric.
BUCKET_FIELDS = ("start_ms", "metric", "count", "sum", "min", "max", "last", "max_score")

_SEP = "\x1f"
#: Layout version of the state-store value, and its header: the version and ten part lengths.
#: Version 1 had no episode ``metric`` column; it is read as -1.
FORMAT = 2
_HEADER = "<H10I"
_HEADER_STRUCT = struct.Struct(_HEADER)


def _empty_core() -> np.ndarray:
    core = np.zeros(len(CORE_FIELDS), dtype=np.int64)
    core[SEQ_HIGH] = -1
    core[MAX_EVENT_MS] = -1
    return core


@dataclass
class DeviceState:
    """One device's state; ``seq_words`` and ``state_size`` fix the array shapes."""

    device_type: str = ""
    site: str = ""
    core: np.ndarray = field(default_factory=_empty_core)
    seqs: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    episodes: np.ndarray = field(default_factory=lambda: np.zeros((0, len(EPISODE_FIELDS)), dtype=np.int64))
    peaks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    metrics: list[str] = field(default_factory=list)
    detectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float64))
    last: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    buckets: np.ndarray = field(default_factory=lambda: np.zeros((0, len(BUCKET_FIELDS)), dtype=np.float64))

    @classmethod
    def new(cls, seq_words: int, state_size: int) -> DeviceState:
        return cls(seqs=np.zeros(seq_words, dtype=np.uint64), detectors=np.zeros((0, state_size), dtype=np.float64))

    def parts(self) -> tuple[bytes, ...]:
        return (
            self.device_type.encode(),
            self.site.encode(),
            _SEP.join(self.metrics).encode(),
            self.core.tobytes(),
            self.seqs.tobytes(),
            self.episodes.tobytes(),
            self.peaks.tobytes(),
            self.detectors.tobytes(),
            self.last.tobytes(),
            self.buckets.tobytes(),
        )

    def to_value(self) -> tuple[bytes]:
        """The state-store value (see :data:`iotwatch.streaming.schemas.DEVICE_STATE_SCHEMA`): the
        parts' lengths (uint32), then the parts, in one binary field -- one field to convert
        per state-store call."""
        parts = self.parts()
        return (_HEADER_STRUCT.pack(FORMAT, *(len(p) for p in parts)) + b"".join(parts),)

    @classmethod
    def from_value(cls, value: tuple[bytes], state_size: int) -> DeviceState:
        """Parse a value of :meth:`to_value`: one writable copy of the blob, the arrays views
        of it (a device's state is loaded for every batch it is in: this is per-device cost)."""
        blob = bytearray(value[0])
        version, *lengths = _HEADER_STRUCT.unpack_from(blob)
        if version not in (1, FORMAT):
            raise ValueError(
                f"device state format {version} (this version reads {FORMAT}): start from a new checkpoint"
            )
        ends = list(accumulate(lengths, initial=_HEADER_STRUCT.size))
        device_type, site, metrics = (blob[a:b].decode() for a, b in zip(ends[:3], ends[1:4], strict=True))

        def array(part: int, dtype: type) -> np.ndarray:
            start = ends[part]
            return np.frombuffer(
                blob, dtype=dtype, count=(ends[part + 1] - start) // np.dtype(dtype).itemsize, offset=start
            )

        width = len(EPISODE_FIELDS) - (1 if version == 1 else 0)
        rows = array(5, np.int64).reshape(-1, width)
        if version == 1:
            rows = np.column_stack([rows, np.full(len(rows), -1, dtype=np.int64)])
        return cls(
            device_type,
            site,
            array(3, np.int64),
            array(4, np.uint64),
            rows,
            array(6, np.float64),
            metrics.split(_SEP) if metrics else [],
            array(7, np.float64).reshape(-1, state_size),
            array(8, np.float64),
            array(9, np.float64).reshape(-1, len(BUCKET_FIELDS)),
        )

    def size_bytes(self) -> int:
        """Bytes this device takes in the state store (the value's payload)."""
        return len(self.to_value()[0])

    def counters(self) -> dict[str, int]:
        return {name: int(self.core[i]) for i, name in enumerate(CORE_FIELDS) if name in COUNTERS}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceState) and self.to_value() == other.to_value()
