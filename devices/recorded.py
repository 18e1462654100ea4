"""Recorded ``timestamp,value`` streams (e.g. the NAB streams in nab-dev) played back as devices
(docs/internals.md, "Recorded streams")."""

from __future__ import annotations

import csv
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from iotwatch.devices.config import SimConfig
from iotwatch.devices.group import DeviceGroup, DeviceSpec, Event
from iotwatch.devices.rng import CounterRng
from iotwatch.errors import UserError

__all__ = ["RecordedSeriesGroup", "load_stream", "stream_start_ms"]

_NEVER = np.iinfo(np.int64).max // 2


def parse_time_ms(text: str) -> int:
    """Epoch ms of epoch seconds or milliseconds, or of an ISO time (UTC unless it says);
    ValueError for anything else."""
    text = text.strip()
    try:
        number = float(text)
    except ValueError:
        pass
    else:  # epoch seconds or milliseconds
        return int(number if number > 1e11 else number * 1000)
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def load_stream(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(epoch ms, values) of a ``timestamp,value`` CSV, in file order (must not go back in time)."""
    times: list[int] = []
    values: list[float] = []
    try:
        with open(path, newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise UserError(f"replay file {path} is empty")
            if [h.strip().lower() for h in header[:2]] != ["timestamp", "value"]:
                raise UserError(f"replay file {path}: expected a 'timestamp,value' header, got {header!r}")
            for line_no, row in enumerate(reader, start=2):
                if not row:
                    continue
                try:
                    times.append(parse_time_ms(row[0]))
                    values.append(float(row[1]))
                except (ValueError, IndexError) as exc:
                    raise UserError(f"replay file {path}, line {line_no}: {exc}") from None
    except OSError as exc:
        raise UserError(f"replay file {path}: {exc.strerror or exc}") from None
    if not times:
        raise UserError(f"replay file {path} has no rows")
    t = np.array(times, dtype=np.int64)
    if np.any(np.diff(t) < 0):
        raise UserError(f"replay file {path}: timestamps go back in time")
    return t, np.array(values, dtype=np.float64)


def stream_start_ms(paths: tuple[Path, ...]) -> int:
    return min(int(load_stream(p)[0][0]) for p in paths)


def device_id_for(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", path.stem)[:128] or "stream"


class RecordedSeriesGroup(DeviceGroup):
    """One device per replayed file; readings follow the file's rows."""

    def __init__(self, files: list[tuple[int, Path]], rng: CounterRng, config: SimConfig, uid_base: int) -> None:
        self.device_type = config.replay_device_type
        self.metrics = (config.replay_metric,)
        self.loop = config.replay_loop
        self.streams: list[tuple[np.ndarray, np.ndarray]] = []
        specs = []
        for n, path in files:
            times, values = load_stream(path)
            offset = 0 if config.replay_keep_time else config.start_ms - int(times[0])
            times = times + offset
            self.streams.append((times, values))
            step = int(np.median(np.diff(times))) if len(times) > 1 else 1000
            specs.append(
                DeviceSpec(
                    uid_base + n, device_id_for(path), config.replay_device_type, "replay", max(step, 1), int(times[0])
                )
            )
        super().__init__(specs, rng)
        self.row = np.zeros(self.size, dtype=np.int64)
        self.lap_offset = np.zeros(self.size, dtype=np.int64)

    def step(self, idx: np.ndarray, t_ms: np.ndarray, seq: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, list[Event]]:
        values = np.array([self.streams[i][1][self.row[i]] for i in idx.tolist()])
        return values[:, None], []

    def advance(self, idx: np.ndarray) -> None:
        self.seq[idx] += 1
        for i in idx.tolist():
            times, _ = self.streams[i]
            row = int(self.row[i]) + 1
            if row >= len(times):
                if not self.loop:
                    self.row[i] = row - 1
                    self.next_due[i] = _NEVER
                    continue
                self.lap_offset[i] += int(times[-1] - times[0]) + int(self.interval[i])
                row = 0
            self.row[i] = row
            self.next_due[i] = int(times[row]) + int(self.lap_offset[i])

    def finished(self) -> bool:
        return bool(np.all(self.next_due >= _NEVER))
