"""The simulators' ground truth: one :class:`Injection` per injected anomaly or transport
fault, written as JSON lines beside a run (``simulate --ground-truth``) and read by the
evaluator that judges alerts against it (:mod:`iotwatch.evaluation.judgement`: the demo,
``iotwatch evaluate --simulated`` and the tests).

Files are sorted by (start_ts, device_id, kind, start_seq) and every field is written with
sorted keys, so equal runs write byte-identical files.

>>> event = Injection(device_id="d", device_type="thermostat", site="h", kind="spike",
...                   category=ANOMALY, start_ts=5, end_ts=5, start_seq=3, end_seq=3,
...                   messages=1, source="rate", params={"metric": "temperature_c"})
>>> decode_injection(encode_injection(event)) == event
True
>>> event.is_anomaly, event.seqs
(True, range(3, 4))
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import msgspec

from iotwatch.contract.detection import canonical_kind

__all__ = [
    "ANOMALY",
    "GROUND_TRUTH_VERSION",
    "OPERATOR",
    "SETPOINT_CHANGE",
    "TRANSPORT",
    "BadGroundTruth",
    "Injection",
    "InjectionSource",
    "decode_injection",
    "encode_injection",
    "read_ground_truth",
    "sort_injections",
    "write_ground_truth",
]

GROUND_TRUTH_VERSION = 1
#: What started an injection: the random rate, a scenario file, or an operator's command.
InjectionSource = Literal["rate", "scenario", "command"]
#: The categories of injection: an anomaly of what a device measures or does (alerts
#: should report it), a fault of the transport (the pipeline should absorb it), or an
#: operator's commanded change (a setpoint moved through the twin: expected, and no alert
#: should report the settling that follows it).
ANOMALY: Literal["anomaly"] = "anomaly"
TRANSPORT: Literal["transport"] = "transport"
OPERATOR: Literal["operator"] = "operator"
#: The operator action the simulators record: a thermostat's setpoint set through its twin.
SETPOINT_CHANGE = "setpoint_change"


class BadGroundTruth(ValueError):
    """A ground-truth line that is not an injection record; says which line and why."""


class Injection(msgspec.Struct, frozen=True, kw_only=True):
    """One injected anomaly or transport fault on one device: the readings it affected."""

    v: int = GROUND_TRUTH_VERSION
    device_id: str
    device_type: str
    site: str
    #: an :class:`iotwatch.contract.detection.AnomalyKind`, or a transport fault's kind
    kind: str
    category: Literal["anomaly", "transport", "operator"]
    #: event time (ms) of the first and the last affected reading (an operator action: when it
    #: was carried out, and when the device's physics has settled after it)
    start_ts: int
    end_ts: int
    #: seqs of the first and the last affected reading (inclusive)
    start_seq: int
    end_seq: int
    #: readings affected (a dropout's are the ones never published)
    messages: int
    source: InjectionSource
    #: the kind's drawn parameters (metric, delta, copies...)
    params: dict[str, Any] = {}
    #: the command that ended it (``simulate --obey-commands``), if one did
    ended_by_command: str | None = None

    @property
    def is_anomaly(self) -> bool:
        return self.category == ANOMALY

    @property
    def seqs(self) -> range:
        """The affected readings' seqs."""
        return range(self.start_seq, self.end_seq + 1)


_DECODER = msgspec.json.Decoder(Injection)
_ENCODER = msgspec.json.Encoder(order="sorted")


def encode_injection(event: Injection) -> bytes:
    return _ENCODER.encode(event)


def decode_injection(line: bytes | str) -> Injection:
    """One JSON line as an :class:`Injection`, or :class:`BadGroundTruth` saying why not.
    Lines without the version field read as version 1, and a kind's alias (``hvac_stuck``,
    ``leak``) as its one spelling."""
    try:
        event = _DECODER.decode(line)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadGroundTruth(f"not a ground-truth record: {exc}") from None
    if event.v != GROUND_TRUTH_VERSION:
        raise BadGroundTruth(f"ground truth v={event.v}, supported [{GROUND_TRUTH_VERSION}]")
    kind = canonical_kind(event.kind)
    return event if kind == event.kind else msgspec.structs.replace(event, kind=kind)


def sort_injections(events: Iterable[Injection]) -> list[Injection]:
    return sorted(events, key=lambda e: (e.start_ts, e.device_id, e.kind, e.start_seq))


def write_ground_truth(path: Path, events: Iterable[Injection]) -> int:
    """Write the sorted records as JSON lines (atomically: a reader sees the old file or the
    whole new one); returns the count."""
    rows = sort_injections(events)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        for event in rows:
            handle.write(_ENCODER.encode(event) + b"\n")
    os.replace(tmp, path)
    return len(rows)


def read_ground_truth(path: Path) -> list[Injection]:
    """Every record of a ground-truth file; :class:`BadGroundTruth` names the first bad line."""
    events = []
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                events.append(decode_injection(line))
            except BadGroundTruth as exc:
                raise BadGroundTruth(f"{path}:{number}: {exc}") from None
    return events
