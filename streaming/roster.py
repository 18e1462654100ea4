"""The devices of one Kafka partition and when each was last heard of: what the stateful
operator's silence timer needs (``device_silent``), kept as one small value per partition
in the state store (:data:`iotwatch.streaming.schemas.ROSTER_SCHEMA`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

_SEP = "\x1f"


class Roster:
    """The devices of one partition with the wall time each was last heard of, and whether
    its silence has been reported: what the silence timer needs, without reading every
    device's full state."""

    def __init__(self, devices: list[str], last_wall_ms: np.ndarray, silent: np.ndarray, timer_ms: int) -> None:
        self.devices, self.last_wall_ms, self.silent, self.timer_ms = devices, last_wall_ms, silent, timer_ms

    @classmethod
    def load(cls, value: tuple[Any, ...] | None) -> Roster:
        if value is None:
            return cls([], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool), 0)
        devices, last, silent, timer_ms = value
        return cls(
            devices.split(_SEP) if devices else [],
            np.frombuffer(last, dtype=np.int64).copy(),
            np.frombuffer(silent, dtype=np.bool_).copy(),
            int(timer_ms),
        )

    def to_value(self) -> tuple[Any, ...]:
        return (_SEP.join(self.devices), self.last_wall_ms.tobytes(), self.silent.tobytes(), self.timer_ms)

    def heard(self, devices: list[str], now_ms: int) -> None:
        rows = pd.Index(self.devices).get_indexer(devices) if self.devices else np.full(len(devices), -1)
        new = np.flatnonzero(rows < 0)
        if len(new):
            rows[new] = len(self.devices) + np.arange(len(new))
            self.devices = self.devices + [devices[i] for i in new.tolist()]
            self.last_wall_ms = np.concatenate([self.last_wall_ms, np.zeros(len(new), dtype=np.int64)])
            self.silent = np.concatenate([self.silent, np.zeros(len(new), dtype=bool)])
        self.last_wall_ms[rows] = now_ms
        self.silent[rows] = False

    def due(self, now_ms: int, timeout_ms: int) -> list[str]:
        """Devices silent for the timeout whose silence was not reported yet (now marked)."""
        rows = np.flatnonzero(~self.silent & (self.last_wall_ms + timeout_ms <= now_ms))
        self.silent[rows] = True
        return [self.devices[i] for i in rows.tolist()]

    def forget(self, now_ms: int, ttl_ms: int) -> None:
        """Drop devices whose state the store's TTL has dropped too."""
        keep = self.last_wall_ms + ttl_ms > now_ms
        if not keep.all():
            self.devices = [d for d, k in zip(self.devices, keep.tolist(), strict=True) if k]
            self.last_wall_ms, self.silent = self.last_wall_ms[keep], self.silent[keep]

    def next_due_ms(self, timeout_ms: int) -> int:
        waiting = self.last_wall_ms[~self.silent]
        return int(waiting.min()) + timeout_ms if len(waiting) else 0
