"""The Spark side of the per-device logic: ``transformWithStateInPandas`` glue.

State lives in the RocksDB state store (one JSON value per device, with a TTL so devices
gone for good are forgotten); a processing-time timer per device detects silence. All
decisions are in :class:`streaming.device_logic.DeviceLogic`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from iotwatch.settings import Settings
from streaming.device_logic import OUTPUT_COLUMNS, DeviceLogic, InputRecord
from streaming.device_state import STATE_SCHEMA, DeviceState
from streaming.fleet import fleet_lookup

_INT_COLUMNS = ("seq", "event_ms", "kafka_partition", "kafka_offset")
_FLOAT_COLUMNS = ("value", "score")


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Every column is built with an explicit type: a column that is all None would be
    inferred as float NaN, and Arrow's conversion of float NaN to a string or binary column
    comes back chunked, which Spark rejects. Nullable integers stay Python ints or None in
    object columns (no pandas extension arrays). Column by column is also several times
    faster than letting pandas infer a frame from the row dicts."""
    columns: dict[str, pd.Series] = {}
    for column in OUTPUT_COLUMNS:
        values = [row.get(column) for row in rows]
        if column in _FLOAT_COLUMNS:
            columns[column] = pd.Series(values, dtype="float64")
        elif column in _INT_COLUMNS and None not in values:
            columns[column] = pd.Series(values, dtype="int64")
        else:
            columns[column] = pd.Series(values, dtype=object)
    return pd.DataFrame(columns, columns=list(OUTPUT_COLUMNS))


def _epoch_ms(stamps: pd.Series) -> list[int | None]:
    """Kafka record timestamps (Spark timestamps, naive or UTC) as epoch milliseconds."""
    missing = stamps.isna().tolist()
    millis = pd.to_datetime(stamps, utc=True).astype("int64") // 1_000_000
    return [None if gone else int(ms) for gone, ms in zip(missing, millis, strict=True)]


class DeviceProcessor(StatefulProcessor):
    """Keyed by the Kafka key (the device id); see DeviceLogic for what happens per record."""

    def __init__(self, settings: Settings) -> None:
        self.all_settings = settings  # the fleet-model watcher needs Kafka and registry settings
        self.settings = settings.stream

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.logic = DeviceLogic(self.settings, fleet_models=fleet_lookup(self.all_settings))
        self.state = handle.getValueState("device", STATE_SCHEMA, int(self.settings.state_ttl_s * 1000))

    def _load(self) -> DeviceState:
        if self.state.exists():
            return DeviceState.from_json(self.state.get()[0])
        return DeviceState()

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
                        ) -> Iterator[pd.DataFrame]:
        state = self._load()
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        records = [InputRecord(key[0], value, int(partition), int(offset), stamp)
                   for frame in rows
                   for value, partition, offset, stamp in zip(frame["value"], frame["partition"], frame["offset"],
                                                              _epoch_ms(frame["timestamp"]), strict=True)]
        out = list(self.logic.process(state, records, now_ms))
        self._rearm_timer(state, now_ms)
        self.state.update((state.to_json(),))
        if out:
            yield _frame(out)

    def _rearm_timer(self, state: DeviceState, now_ms: int) -> None:
        if state.timer_ms:
            self.handle.deleteTimer(state.timer_ms)
        state.timer_ms = now_ms + int(self.settings.silence_timeout_s * 1000)
        self.handle.registerTimer(state.timer_ms)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
                           ) -> Iterator[pd.DataFrame]:
        if not self.state.exists():
            return
        state = self._load()
        state.timer_ms = 0  # fired; re-armed when data comes back
        out = list(self.logic.silence(state, timerValues.getCurrentProcessingTimeInMs() or int(time.time() * 1000)))
        self.state.update((state.to_json(),))
        if out:
            yield _frame(out)

    def close(self) -> None:
        pass
