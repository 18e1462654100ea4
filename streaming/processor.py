"""The Spark side of the per-partition logic: ``transformWithStateInPandas`` glue.

The stateful operator is keyed by Kafka partition: every record of a device is in its
device's partition (the gateway keys by ``device_id``), so one call handles all of a
partition's records of a micro-batch at once, on columns (:mod:`streaming.engine`).
Per-device state lives in the RocksDB state store as one ``MapState`` entry per device
(with a TTL, so devices gone for good are forgotten); a small per-partition roster says
when each device was last heard of, and one processing-time timer per partition fires
when the next device is due to be reported silent. (Adding partitions to the raw topic
moves devices between partitions, and their state with them is lost: as with Kafka
Streams, repartitioning means reprocessing -- ``iotwatch replay``.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from iotwatch.contract import DecodedBatch, decode_batch
from iotwatch.settings import Settings
from models.kernels import tail_ensemble as kernel
from streaming.device_state import DeviceState
from streaming.engine import PartitionEngine, RecordColumns
from streaming.fleet import fleet_lookup
from streaming.schemas import DEVICE_STATE_SCHEMA, ROSTER_SCHEMA

_SEP = "\x1f"


class MapStateStore:
    """A partition's device states in a ``MapState`` (one entry per device)."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def load(self, device_id: str) -> DeviceState | None:
        value = self.state.getValue((device_id,))
        return None if value is None else DeviceState.from_value(value, kernel.STATE_SIZE)

    def save(self, device_id: str, state: DeviceState) -> None:
        self.state.updateValue((device_id,), state.to_value())


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
        return cls(devices.split(_SEP) if devices else [], np.frombuffer(last, dtype=np.int64).copy(),
                   np.frombuffer(silent, dtype=np.bool_).copy(), int(timer_ms))

    def to_value(self) -> tuple[Any, ...]:
        return (_SEP.join(self.devices), self.last_wall_ms.tobytes(), self.silent.tobytes(), self.timer_ms)

    def heard(self, devices: list[str], now_ms: int) -> None:
        index = {d: i for i, d in enumerate(self.devices)}
        new = [d for d in devices if d not in index]
        if new:
            self.devices = self.devices + new
            self.last_wall_ms = np.concatenate([self.last_wall_ms, np.zeros(len(new), dtype=np.int64)])
            self.silent = np.concatenate([self.silent, np.zeros(len(new), dtype=bool)])
            index = {d: i for i, d in enumerate(self.devices)}
        rows = np.array([index[d] for d in devices], dtype=np.int64)
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


def unpack(frames: Iterator[pd.DataFrame], partition: int) -> RecordColumns:
    """Packed rows (``streaming.schemas.PACKED_SCHEMA``) back into one partition's columns."""
    chunks = sorted((row for frame in frames for row in frame.itertuples(index=False)), key=lambda r: r.first_offset)
    if not chunks:
        empty = np.zeros(0, dtype=np.int64)
        return RecordColumns(partition, empty, empty, np.zeros(0, dtype=object), np.zeros(0, dtype=object),
                             decode_batch([]))
    cat = lambda name, dtype=None: np.concatenate([np.asarray(getattr(c, name), dtype=dtype) for c in chunks])  # noqa: E731
    sizes = np.array([len(c.offset) for c in chunks], dtype=np.int64)
    row_base = np.repeat(np.concatenate([[0], np.cumsum(sizes)[:-1]]), [len(c.metric_row) for c in chunks])
    decoded = DecodedBatch(
        reason=cat("reason", object), detail=cat("detail", object), device_id=cat("device_id", object),
        device_type=cat("device_type", object), site=cat("site", object), event=cat("event", object),
        seq=cat("seq", np.int64), ts=cat("ts", np.int64),
        metric_row=cat("metric_row", np.int64) + row_base.astype(np.int64), metric_name=cat("metric_name", object),
        metric_value=cat("metric_value", np.float64))
    return RecordColumns(partition, cat("offset", np.int64), cat("append_ms", np.int64), cat("key", object),
                         cat("raw", object), decoded)


class PartitionProcessor(StatefulProcessor):
    """Keyed by Kafka partition; see :class:`streaming.engine.PartitionEngine`."""

    def __init__(self, settings: Settings) -> None:
        self.all_settings = settings  # the fleet-model watcher needs Kafka and registry settings
        self.settings = settings.stream

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        kernel.warm()
        self.engine = PartitionEngine(self.settings, fleet_models=fleet_lookup(self.all_settings))
        ttl_ms = int(self.settings.state_ttl_s * 1000)
        self.devices = MapStateStore(handle.getMapState("devices", "device_id string", DEVICE_STATE_SCHEMA, ttl_ms))
        self.roster = handle.getValueState("roster", ROSTER_SCHEMA)
        self.timeout_ms = int(self.settings.silence_timeout_s * 1000)
        self.ttl_ms = ttl_ms

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
                        ) -> Iterator[pd.DataFrame]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        records = unpack(rows, int(key[0]))
        out = self.engine.process(self.devices, records, now_ms)
        roster = Roster.load(self.roster.get() if self.roster.exists() else None)
        roster.heard(out.devices, now_ms)
        frames = [out.frame]
        frames.extend(self._report_silence(roster, now_ms))
        if any(len(f) for f in frames):
            yield pd.concat([f for f in frames if len(f)], ignore_index=True) if len(frames) > 1 else frames[0]

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
                           ) -> Iterator[pd.DataFrame]:
        if not self.roster.exists():
            return
        roster = Roster.load(self.roster.get())
        roster.timer_ms = 0  # this one fired
        for frame in self._report_silence(roster, timerValues.getCurrentProcessingTimeInMs()):
            yield frame

    def _report_silence(self, roster: Roster, now_ms: int) -> list[pd.DataFrame]:
        """Raise ``device_silent`` for devices due, keep the roster and re-arm the timer."""
        frames = []
        due = roster.due(now_ms, self.timeout_ms)
        if due:
            frames.append(self.engine.silence(self.devices, due, now_ms).frame)
        roster.forget(now_ms, self.ttl_ms)
        next_ms = roster.next_due_ms(self.timeout_ms)
        if next_ms != roster.timer_ms:
            if roster.timer_ms:
                self.handle.deleteTimer(roster.timer_ms)
            if next_ms:
                self.handle.registerTimer(next_ms)
            roster.timer_ms = next_ms
        self.roster.update(roster.to_value())
        return [f for f in frames if len(f)]

    def close(self) -> None:
        pass
