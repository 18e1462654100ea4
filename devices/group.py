"""A vectorised group of devices of one type: schedule, sequence numbers, serialisation
(docs/internals.md, "Device groups")."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from iotwatch.contract.device_topics import status_topic, telemetry_topic
from iotwatch.contract.metric_catalog import METRIC_DECIMALS
from iotwatch.contract.telemetry import SCHEMA_VERSION
from iotwatch.devices.rng import CounterRng, Floats

__all__ = ["DeviceGroup", "DeviceSpec", "Event"]


@dataclass(frozen=True)
class DeviceSpec:
    """One simulated device as the fleet builder describes it."""

    uid: int  # fleet-wide index, stable whatever the process count
    device_id: str
    device_type: str
    site: str
    interval_ms: int
    first_due_ms: int
    home: int = -1  # index of its home in the shard's HomeContext (home devices only)
    params: dict[str, Any] = field(default_factory=dict)


#: (row in the batch, event name, event_data or None)
Event = tuple[int, str, dict[str, Any] | None]


class DeviceGroup:
    """Devices of one type simulated together. Subclasses set ``device_type`` and
    ``metrics`` and implement :meth:`step` (and optionally :meth:`finalize`)."""

    device_type: str  # set by the class, or per instance (a replayed file's)
    metrics: tuple[str, ...]
    #: uniforms per reading the model's step consumes (passed in as ``u``)
    draws: ClassVar[int] = 0

    def __init__(self, specs: list[DeviceSpec], rng: CounterRng) -> None:
        self.rng = rng
        self.specs = specs
        self.size = len(specs)
        self.uid = np.array([s.uid for s in specs], dtype=np.uint64)
        self.seq = np.zeros(self.size, dtype=np.int64)
        self.next_due = np.array([s.first_due_ms for s in specs], dtype=np.int64)
        self.interval = np.array([s.interval_ms for s in specs], dtype=np.int64)
        self.device_ids = [s.device_id for s in specs]
        self.sites = [s.site for s in specs]
        self.topics = [telemetry_topic(s.site, s.device_type, s.device_id) for s in specs]
        self.status_topics = [status_topic(s.site, s.device_type, s.device_id) for s in specs]
        #: physical anomaly mode per device (0 = normal); set by the anomaly injector
        self.mode = np.zeros(self.size, dtype=np.int8)
        #: time the current mode started (ms), for models that need it
        self.mode_since = np.zeros(self.size, dtype=np.int64)
        self.prefixes = [
            f'{{"v":{SCHEMA_VERSION},"device_id":{json.dumps(s.device_id)},'
            f'"device_type":{json.dumps(s.device_type)},"site":{json.dumps(s.site)},"seq":'
            for s in specs
        ]
        body = ",".join(f'"{m}":%.{METRIC_DECIMALS.get(m, 3)}f' for m in self.metrics)
        self._format = '%s%d,"ts":%d,"metrics":{' + body + "}}"
        self.decimals = np.array([METRIC_DECIMALS.get(m, 3) for m in self.metrics])
        self.metric_index = {m: i for i, m in enumerate(self.metrics)}

    # -- schedule -------------------------------------------------------------------

    def due(self, until_ms: int) -> np.ndarray:
        """Indices of devices with a reading due before ``until_ms``."""
        return np.flatnonzero(self.next_due < until_ms)

    def advance(self, idx: np.ndarray) -> None:
        self.seq[idx] += 1
        self.next_due[idx] += self.interval[idx]

    def next_due_min(self) -> int:
        return int(self.next_due.min()) if self.size else 2**62

    # -- physics (subclasses) ----------------------------------------------------------

    def step(self, idx: np.ndarray, t_ms: np.ndarray, seq: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, list[Event]]:
        """Advance the state of devices ``idx`` to their readings at ``t_ms``; return
        the readings ``(len(idx), len(metrics))`` and any events. ``u`` holds
        ``draws`` uniforms per reading, keyed by (seed, device, seq)."""
        raise NotImplementedError

    def finalize(self, idx: np.ndarray, t_ms: np.ndarray, seq: np.ndarray, values: np.ndarray) -> list[Event]:
        """See the final readings (after anomalies); return events triggered by them."""
        return []

    def dt_s(self, idx: npt.NDArray[np.intp]) -> Floats:
        return self.interval[idx] / 1000.0

    # -- serialisation -------------------------------------------------------------------

    def payloads(self, idx: np.ndarray, seq: np.ndarray, ts: np.ndarray, values: np.ndarray) -> list[str]:
        """JSON payloads in the contract's compact form (``Telemetry.to_json`` layout)."""
        fmt = self._format
        prefixes = self.prefixes
        columns = [values[:, j].tolist() for j in range(values.shape[1])]
        return [
            fmt % row
            for row in zip([prefixes[i] for i in idx.tolist()], seq.tolist(), ts.tolist(), *columns, strict=True)
        ]

    def event_payload(
        self, i: int, seq: int, ts: int, row: np.ndarray, event: str, event_data: dict[str, Any] | None
    ) -> str:
        metrics = {m: round(float(v), int(d)) for m, v, d in zip(self.metrics, row, self.decimals, strict=True)}
        message: dict[str, Any] = {
            "v": SCHEMA_VERSION,
            "device_id": self.device_ids[i],
            "device_type": self.device_type,
            "site": self.sites[i],
            "seq": int(seq),
            "ts": int(ts),
            "metrics": metrics,
            "event": event,
        }
        if event_data is not None:
            message["event_data"] = event_data
        return json.dumps(message, separators=(",", ":"))
