"""Labelled streams for evaluation, from pluggable sources.

A :class:`LabelledSource` yields :class:`LabelledStream` objects: readings in event-time
order plus anomaly windows as inclusive row ranges. Two sources exist:

- :class:`NabSource` -- a directory in NAB layout (``data/<group>/<name>.csv`` with
  ``timestamp,value`` and ``windows.json``);
- :class:`SimulatorSource` -- the device simulator's readings (contract messages, one
  JSON object a line) with its ground truth (:mod:`iotwatch.contract.ground_truth`): one
  stream per ``(device_id, metric)``, windows from the injections on that device.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from iotwatch.contract.ground_truth import BadGroundTruth, Injection, read_ground_truth
from iotwatch.errors import IotwatchError

__all__ = [
    "NAB_PUBLISHED_SCORES",
    "NAB_SAMPLE",
    "NAB_SPLIT",
    "LabelledSource",
    "LabelledStream",
    "NabSource",
    "SimulatorSource",
    "read_nab_csv",
    "split_keys",
    "windows_to_rows",
]

#: Seven labelled NAB streams shipped with iotwatch (MIT licence, see its README): the
#: default of ``iotwatch evaluate`` and what the tests score, on any clone.
NAB_SAMPLE = Path(__file__).resolve().parent / "nab_sample"
#: The split of the nab-dev streams into the half detector parameters were chosen on
#: (``tuning``) and the half kept back to check them (``held_out``).
NAB_SPLIT = Path(__file__).resolve().parent / "nab_split.json"
#: NAB's published standard-profile results per nab-dev stream (MIT licence, NAB v1.1
#: ``results/``): detector, file, corpus threshold, score, true and false positives, misses.
NAB_PUBLISHED_SCORES = Path(__file__).resolve().parent / "nab_published_scores.csv"


def split_keys(part: str) -> set[str]:
    """Stream keys of one part of :data:`NAB_SPLIT` (``tuning`` or ``held_out``).

    >>> sorted(split_keys("held_out"))[:2]
    ['artificialNoAnomaly/art_daily_no_noise.csv', 'artificialNoAnomaly/art_daily_small_noise.csv']
    """
    parts = json.loads(NAB_SPLIT.read_text())
    if part not in ("tuning", "held_out"):
        raise IotwatchError(f"no split part {part!r}: tuning or held_out")
    return set(parts[part])


@dataclass
class LabelledStream:
    """One labelled stream: ``values`` is ``(n, len(metrics))``, ``t_ms`` epoch ms."""

    key: str
    group: str
    metrics: list[str]
    t_ms: np.ndarray
    values: np.ndarray
    windows: list[tuple[int, int]]
    kinds: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.t_ms)


class LabelledSource(Protocol):
    """Anything that yields labelled streams in a deterministic order."""

    def streams(self) -> Iterator[LabelledStream]: ...


def read_nab_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``timestamp,value`` CSV -> (epoch ms int64, float values). Timestamps are naive UTC."""
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise IotwatchError(f"{path}: not a timestamp,value CSV ({exc})") from None
    if list(frame.columns[:2]) != ["timestamp", "value"]:
        raise IotwatchError(f"{path}: expected columns timestamp,value, found {','.join(map(str, frame.columns))}")
    try:
        stamps = pd.to_datetime(frame["timestamp"], format="mixed")
    except (ValueError, TypeError) as exc:
        raise IotwatchError(f"{path}: unreadable timestamp ({exc})") from None
    t_ms = (stamps.astype("datetime64[ns]").to_numpy().astype(np.int64) // 1_000_000).astype(np.int64)
    values = pd.to_numeric(frame["value"], errors="coerce").to_numpy(dtype=float)
    return t_ms, values


def windows_to_rows(t_ms: np.ndarray, limits: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Map ``(start_ms, end_ms)`` limits to inclusive row ranges; empty ones are dropped."""
    rows = []
    for start, end in sorted(limits):
        left = int(np.searchsorted(t_ms, start, side="left"))
        right = int(np.searchsorted(t_ms, end, side="right")) - 1
        if left <= right:
            rows.append((left, right))
    merged: list[tuple[int, int]] = []
    for left, right in rows:
        if merged and left <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], right))
        else:
            merged.append((left, right))
    return merged


def _to_ms(stamp: str) -> int:
    return int(pd.Timestamp(stamp).value // 1_000_000)


class NabSource:
    """Streams of a NAB-layout directory, sorted by ``<group>/<name>.csv`` (only the keys
    in ``only`` when given)."""

    def __init__(self, root: Path, only: set[str] | None = None) -> None:
        self.root = Path(root)
        self.only = only
        windows_path = self.root / "windows.json"
        if not (self.root / "data").is_dir() or not windows_path.is_file():
            raise IotwatchError(f"{self.root} is not a NAB-layout dataset (needs data/ and windows.json)")
        self.windows: dict[str, list[list[str]]] = json.loads(windows_path.read_text())

    def keys(self) -> list[str]:
        data = self.root / "data"
        keys = sorted(p.relative_to(data).as_posix() for p in data.glob("*/*.csv"))
        return keys if self.only is None else [k for k in keys if k in self.only]

    def streams(self) -> Iterator[LabelledStream]:
        for key in self.keys():
            t_ms, values = read_nab_csv(self.root / "data" / key)
            limits = [(_to_ms(a), _to_ms(b)) for a, b in self.windows.get(key, [])]
            yield LabelledStream(
                key=key,
                group=key.split("/")[0],
                metrics=["value"],
                t_ms=t_ms,
                values=values.reshape(-1, 1),
                windows=windows_to_rows(t_ms, limits),
            )


class SimulatorSource:
    """Simulator readings (JSONL of contract messages) labelled by ground-truth JSONL."""

    def __init__(self, readings: Path, truth: Path) -> None:
        self.readings = Path(readings)
        self.truth = Path(truth)

    @staticmethod
    def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
        with path.open() as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise IotwatchError(f"{path}:{number}: not JSON ({exc.msg})") from None

    def streams(self) -> Iterator[LabelledStream]:
        truth: dict[str, list[Injection]] = defaultdict(list)
        try:
            injections = read_ground_truth(self.truth)
        except BadGroundTruth as exc:
            raise IotwatchError(str(exc)) from None
        for event in injections:
            truth[event.device_id].append(event)
        series: dict[tuple[str, str], list[tuple[int, int, float]]] = defaultdict(list)
        types: dict[str, str] = {}
        for msg in self._jsonl(self.readings):
            device = str(msg["device_id"])
            types[device] = str(msg.get("device_type", "device"))
            for metric, value in (msg.get("metrics") or {}).items():
                series[(device, metric)].append((int(msg["ts"]), int(msg.get("seq", 0)), float(value)))
        for (device, metric), rows in sorted(series.items()):
            rows.sort()
            t_ms = np.array([r[0] for r in rows], dtype=np.int64)
            records = truth.get(device, [])
            limits = [(r.start_ts, r.end_ts) for r in records]
            yield LabelledStream(
                key=f"{device}/{metric}",
                group=types[device],
                metrics=[metric],
                t_ms=t_ms,
                values=np.array([[r[2]] for r in rows], dtype=float).reshape(-1, 1),
                windows=windows_to_rows(t_ms, limits),
                kinds=sorted({r.kind for r in records}),
            )
