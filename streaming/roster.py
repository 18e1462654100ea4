"""The devices of one Kafka partition and when each was last heard of: what the stateful
operator's silence timer needs (``device_silent``), judged against the partition's own
clocks so an outage is no silence (docs/streaming-internals.md, "Roster and silence").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

_SEP = "\x1f"
#: Per-device int64 columns of ``last_wall_ms`` in the stored value.
_WALL, _APPEND, _EVENT = range(3)
_COLUMNS = 3
#: Values of ``silent``: still reporting, reported silent, said goodbye (offline).
REPORTING, SILENT, OFFLINE = 0, 1, 2


class Roster:
    """The devices of one partition: when each was last heard of (wall, append and event
    time), whether its silence was reported or it went offline, and the partition's clocks."""

    def __init__(
        self,
        devices: list[str],
        heard_ms: np.ndarray,
        state: np.ndarray,
        timer_ms: int,
        log_ms: int = 0,
        event_ms: int = 0,
    ) -> None:
        self.devices, self.heard_ms, self.state, self.timer_ms = devices, heard_ms, state, timer_ms
        self.log_ms, self.event_ms = log_ms, event_ms

    @classmethod
    def load(cls, value: tuple[Any, ...] | None) -> Roster:
        if value is None:
            return cls([], np.zeros((0, _COLUMNS), dtype=np.int64), np.zeros(0, dtype=np.int8), 0)
        devices, last, state, timer_ms = value
        names = devices.split(_SEP) if devices else []
        numbers = np.frombuffer(last, dtype=np.int64)
        heard = numbers[: len(names) * _COLUMNS].reshape(len(names), _COLUMNS).copy()
        log_ms, event_ms = (int(v) for v in numbers[len(names) * _COLUMNS :])
        return cls(names, heard, np.frombuffer(state, dtype=np.int8).copy(), int(timer_ms), log_ms, event_ms)

    def to_value(self) -> tuple[Any, ...]:
        numbers = np.concatenate([self.heard_ms.ravel(), np.asarray([self.log_ms, self.event_ms], dtype=np.int64)])
        return (_SEP.join(self.devices), numbers.tobytes(), self.state.tobytes(), self.timer_ms)

    def _rows(self, devices: list[str]) -> np.ndarray:
        """The rows of ``devices``, new ones appended."""
        rows = pd.Index(self.devices).get_indexer(pd.Index(devices)) if self.devices else np.full(len(devices), -1)
        new = np.flatnonzero(rows < 0)
        if len(new):
            rows[new] = len(self.devices) + np.arange(len(new))
            self.devices = self.devices + [devices[i] for i in new.tolist()]
            self.heard_ms = np.concatenate([self.heard_ms, np.zeros((len(new), _COLUMNS), dtype=np.int64)])
            self.state = np.concatenate([self.state, np.full(len(new), REPORTING, dtype=np.int8)])
        return rows

    def heard(
        self, devices: list[str], now_ms: int, append_ms: np.ndarray | None = None, event_ms: np.ndarray | None = None
    ) -> None:
        """``devices`` sent records this batch; ``append_ms``/``event_ms``: each one's newest
        Kafka append time and event time (0 or absent: unknown), which move the partition's
        clocks. A device's event time counts no later than its append time (a device whose
        clock runs ahead does not move the partition's event clock)."""
        rows = self._rows(devices)
        self.heard_ms[rows, _WALL] = now_ms
        self.state[rows] = REPORTING
        if append_ms is not None and len(append_ms):
            appended = np.asarray(append_ms, dtype=np.int64)
            self.heard_ms[rows, _APPEND] = np.maximum(self.heard_ms[rows, _APPEND], appended)
            self.log_ms = max(self.log_ms, int(appended.max()))
        if event_ms is not None and len(event_ms):
            events = np.asarray(event_ms, dtype=np.int64)
            if append_ms is not None and len(append_ms):
                events = np.where(appended > 0, np.minimum(events, appended), events)
            self.heard_ms[rows, _EVENT] = np.maximum(self.heard_ms[rows, _EVENT], events)
            self.event_ms = max(self.event_ms, int(events.max()))

    def said_goodbye(self, devices: list[str]) -> None:
        """These devices went offline cleanly: no silence is reported for them."""
        self.state[self._rows(devices)] = OFFLINE

    def reporting(self) -> int:
        """Devices heard of that neither went silent nor said goodbye."""
        return int((self.state == REPORTING).sum())

    def offline(self) -> list[str]:
        return [self.devices[i] for i in np.flatnonzero(self.state == OFFLINE).tolist()]

    def due(self, now_ms: int, timeout_ms: int) -> list[str]:
        """Devices silent for the timeout, in wall time and while the partition's clocks moved
        on without them, whose silence was not reported yet (now marked)."""
        rows = np.flatnonzero(
            self._waiting() & (self.heard_ms[:, _WALL] + timeout_ms <= now_ms) & self._left_behind(timeout_ms)
        )
        self.state[rows] = SILENT
        return [self.devices[i] for i in rows.tolist()]

    def held(self, now_ms: int, timeout_ms: int) -> int:
        """Devices the wall clock says are silent but the partition's clocks do not: what an
        input gap holds."""
        return int(
            (self._waiting() & (self.heard_ms[:, _WALL] + timeout_ms <= now_ms) & ~self._left_behind(timeout_ms)).sum()
        )

    def _waiting(self) -> np.ndarray:
        waiting: np.ndarray = self.state == REPORTING
        return waiting

    def _left_behind(self, timeout_ms: int) -> np.ndarray:
        """Whether each device's append and event time are a timeout behind the partition's
        (a clock the partition never had, e.g. records without Kafka timestamps, is not judged)."""
        behind = np.ones(len(self.devices), dtype=bool)
        for column, clock in ((_APPEND, self.log_ms), (_EVENT, self.event_ms)):
            if clock > 0:
                behind &= self.heard_ms[:, column] + timeout_ms <= clock
        return behind

    def forget(self, now_ms: int, ttl_ms: int) -> None:
        """Drop devices whose state the store's TTL has dropped too."""
        keep = self.heard_ms[:, _WALL] + ttl_ms > now_ms
        if not keep.all():
            self.devices = [d for d, k in zip(self.devices, keep.tolist(), strict=True) if k]
            self.heard_ms, self.state = self.heard_ms[keep], self.state[keep]

    def next_due_ms(self, timeout_ms: int, now_ms: int) -> int:
        """When the timer should look again: the first device still reporting whose wall-time
        timeout is ahead (0: none). Devices past it wait for the partition's clocks, which only
        records move: the next batch with records looks at them."""
        due = self.heard_ms[self._waiting(), _WALL] + timeout_ms
        ahead = due[due > now_ms]
        return int(ahead.min()) if len(ahead) else 0
