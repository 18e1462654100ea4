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
  device detector's kernel, see :mod:`models.kernels`) and the metric's previous value
  (the fleet model's change features);
- ``buckets`` (float64 rows, :data:`BUCKET_FIELDS`): open event-time aggregates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import struct

import numpy as np

#: int64 fields of ``DeviceState.core``, by position.
CORE_FIELDS = ("seq_high", "max_event_ms", "last_wall_ms", "last_append_ms", "received", "scored", "duplicates",
               "late", "dead_lettered", "seq_resets", "clock_steps", "seq_gaps")
SEQ_HIGH, MAX_EVENT_MS, LAST_WALL_MS, LAST_APPEND_MS, RECEIVED, SCORED, DUPLICATES, LATE, DEAD_LETTERED, \
    SEQ_RESETS, CLOCK_STEPS, SEQ_GAPS = range(len(CORE_FIELDS))
#: Counters summed into the job's totals (a subset of CORE_FIELDS).
COUNTERS = CORE_FIELDS[RECEIVED:]

#: int64 fields of one episode row (the alert lifecycle of one rule of one device).
EPISODE_FIELDS = ("rule", "status", "above", "below", "start_ms", "start_seq", "last_ms", "occurrences")
EP_RULE, EP_STATUS, EP_ABOVE, EP_BELOW, EP_START_MS, EP_START_SEQ, EP_LAST_MS, EP_OCCURRENCES = range(
    len(EPISODE_FIELDS))
IDLE, PENDING, OPEN = 0, 1, 2

#: float64 fields of one open aggregate bucket of one metric.
BUCKET_FIELDS = ("start_ms", "metric", "count", "sum", "min", "max", "last", "max_score")

_SEP = "\x1f"
#: Layout version of the state-store value, and its header: the version and ten part lengths.
FORMAT = 1
_HEADER = "<H10I"

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
        return (self.device_type.encode(), self.site.encode(), _SEP.join(self.metrics).encode(), self.core.tobytes(),
                self.seqs.tobytes(), self.episodes.tobytes(), self.peaks.tobytes(), self.detectors.tobytes(),
                self.last.tobytes(), self.buckets.tobytes())

    def to_value(self) -> tuple[bytes]:
        """The state-store value (see :data:`streaming.schemas.DEVICE_STATE_SCHEMA`): the
        parts' lengths (uint32), then the parts, in one binary field -- one field to convert
        per state-store call."""
        parts = self.parts()
        return (struct.pack(_HEADER, FORMAT, *(len(p) for p in parts)) + b"".join(parts),)

    @classmethod
    def from_value(cls, value: tuple[bytes], state_size: int) -> DeviceState:
        blob = value[0]
        version, *lengths = struct.unpack_from(_HEADER, blob)
        if version != FORMAT:
            raise ValueError(f"device state format {version} (this version reads {FORMAT}): start from a new checkpoint")
        offsets = np.cumsum([struct.calcsize(_HEADER), *lengths])
        raw = [blob[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        device_type, site, metrics = (part.decode() for part in raw[:3])
        core, seqs, episodes, peaks, detectors, last, buckets = raw[3:]
        names = metrics.split(_SEP) if metrics else []
        return cls(device_type, site, np.frombuffer(core, dtype=np.int64).copy(),
                   np.frombuffer(seqs, dtype=np.uint64).copy(),
                   np.frombuffer(episodes, dtype=np.int64).reshape(-1, len(EPISODE_FIELDS)).copy(),
                   np.frombuffer(peaks, dtype=np.float64).copy(), names,
                   np.frombuffer(detectors, dtype=np.float64).reshape(-1, state_size).copy(),
                   np.frombuffer(last, dtype=np.float64).copy(),
                   np.frombuffer(buckets, dtype=np.float64).reshape(-1, len(BUCKET_FIELDS)).copy())

    def size_bytes(self) -> int:
        """Bytes this device takes in the state store (the value's payload)."""
        return len(self.to_value()[0])

    def counters(self) -> dict[str, int]:
        return {name: int(self.core[i]) for i, name in enumerate(CORE_FIELDS) if name in COUNTERS}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceState) and self.to_value() == other.to_value()
