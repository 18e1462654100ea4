"""The per-device state the streaming job keeps in Spark's state store.

A few numbers per metric and per rule, never a model: detector states are the compact
dicts of :meth:`models.base.Detector.to_state`; duplicate detection is a bitmap of the
last ``dedup_window`` seqs; aggregates are open event-time buckets (count, sum, min, max,
last, max score). Serialised as one JSON string so a batch costs one state read and one
write per device.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from streaming.alerting import Episode

STATE_SCHEMA = "state string"
STATE_FORMAT = 1


@dataclass
class SeqWindow:
    """Which of the last ``size`` seqs were seen: bit i stands for ``high - i``."""

    high: int = -1
    bits: int = 0

    def observe(self, seq: int, size: int) -> str:
        """Record ``seq``; returns ``new``, ``duplicate`` or ``reset`` (seq far below the
        window: a device that restarted its counter)."""
        if seq > self.high:
            shift = seq - self.high
            self.bits = ((self.bits << shift) | 1) & ((1 << size) - 1) if shift < size else 1
            self.high = seq
            return "new"
        offset = self.high - seq
        if offset >= size:
            return "reset"
        if self.bits >> offset & 1:
            return "duplicate"
        self.bits |= 1 << offset
        return "new"


@dataclass
class Counters:
    """Per-device accounting: every record is exactly one of these outcomes."""

    received: int = 0
    scored: int = 0
    duplicates: int = 0
    late: int = 0
    dead_lettered: int = 0
    seq_resets: int = 0
    seq_gaps: int = 0
    clock_steps: int = 0  # scored readings, in seq order, far behind the device's newest event time


@dataclass
class DeviceState:
    device_id: str = ""
    device_type: str = ""
    site: str = ""
    seqs: SeqWindow = field(default_factory=SeqWindow)
    max_event_ms: int = -1
    last_wall_ms: int = 0
    last_append_ms: int = 0  # Kafka timestamp of the device's newest record (0: none seen)
    timer_ms: int = 0
    counters: Counters = field(default_factory=Counters)
    detectors: dict[str, dict[str, Any]] = field(default_factory=dict)  # metric -> detector state
    episodes: dict[str, Episode] = field(default_factory=dict)  # rule -> alert episode
    buckets: dict[int, dict[str, list[float]]] = field(default_factory=dict)  # start ms -> metric -> stats
    last_metrics: dict[str, float] = field(default_factory=dict)  # previous reading, for the fleet model
    def to_json(self) -> str:
        doc = asdict(self)
        doc["seqs"]["bits"] = format(self.seqs.bits, "x")
        doc["buckets"] = {str(k): v for k, v in self.buckets.items()}
        doc["format"] = STATE_FORMAT
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> DeviceState:
        doc = json.loads(text)
        if doc.pop("format", None) != STATE_FORMAT:
            raise ValueError("device state written by an incompatible version; start with a new checkpoint")
        doc["seqs"] = SeqWindow(doc["seqs"]["high"], int(doc["seqs"]["bits"] or "0", 16))
        doc["counters"] = Counters(**doc["counters"])
        doc["episodes"] = {rule: Episode(**episode) for rule, episode in doc["episodes"].items()}
        doc["buckets"] = {int(k): v for k, v in doc["buckets"].items()}
        return cls(**doc)
