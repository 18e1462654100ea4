"""After a run: where every reading went, by device and seq (docs/internals.md, "Harness accounting")."""

from __future__ import annotations

import json
from array import array
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from iotwatch.contract.dead_letters import DeadLetter
from iotwatch.contract.ground_truth import Injection

#: device -> its seqs, sorted and unique (an hour's run has millions: arrays, not sets)
Seqs = dict[str, np.ndarray]

_INT64 = 2**63
#: Time to read a raw topic for the loss proof (an hour's load is millions of records, read
#: at about 100,000 a second here): a topic not read to its end in time fails the proof, it
#: does not prove a shorter one.
RAW_READ_TIMEOUT_S = 1800.0


@dataclass
class RawIndex:
    """The raw topic's readings in columns, a row per (device, seq): its first copy's append
    time and the reading's own time. Sorted by device code, then seq."""

    devices: list[str] = field(default_factory=list)  # code -> device id
    device: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    seq: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    #: when the reading was appended to the raw topic (first copy), ms
    appended_ms: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    #: the reading's own time (``ts``), ms
    event_ms: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    #: device -> (device_type, site)
    identities: dict[str, tuple[str, str]] = field(default_factory=dict)
    records: int = 0  # every record read, copies and unparseable ones included
    unparseable: int = 0

    @property
    def readings(self) -> int:
        return len(self.seq)

    def seqs(self) -> Seqs:
        """Device -> its seqs in the topic."""
        return _split(self.devices, self.device, self.seq)

    def last_seq(self) -> dict[str, int]:
        return {device: int(seqs[-1]) for device, seqs in self.seqs().items()}

    def appended_at(self, device: str, seq: int) -> int | None:
        """When reading ``(device, seq)`` was first appended to the topic (ms), if it was."""
        code = self.codes.get(device)
        if code is None:
            return None
        low, high = np.searchsorted(self.device, [code, code + 1])
        at = low + int(np.searchsorted(self.seq[low:high], seq))
        return int(self.appended_ms[at]) if at < high and self.seq[at] == seq else None

    @cached_property
    def codes(self) -> dict[str, int]:
        return {name: code for code, name in enumerate(self.devices)}


def index_raw(batches: Iterable[Iterable[Any]]) -> RawIndex:
    """The raw topic's :class:`RawIndex` from its records, read a batch at a time (see
    :func:`iotwatch.clients.kafka.batches_to_end`): only four numbers a record are kept."""
    codes: dict[str, int] = {}
    identities: dict[str, tuple[str, str]] = {}
    device, seq, appended, event = array("i"), array("q"), array("q"), array("q")
    records = unparseable = 0
    for batch in batches:
        for record in batch:
            records += 1
            try:
                body = json.loads(record.value())
                name, number, ts = str(body["device_id"]), int(body["seq"]), int(body.get("ts") or 0)
            except (ValueError, KeyError, TypeError):
                unparseable += 1
                continue
            if not (-_INT64 <= number < _INT64 and -_INT64 <= ts < _INT64):
                unparseable += 1
                continue
            code = codes.setdefault(name, len(codes))
            if name not in identities:
                identities[name] = (str(body.get("device_type")), str(body.get("site")))
            device.append(code)
            seq.append(number)
            appended.append(record.timestamp()[1])
            event.append(ts)
    codes_column, seqs = np.frombuffer(device, np.int32), np.frombuffer(seq, np.int64)
    first = _first_of_each_pair(codes_column, seqs)
    return RawIndex(
        devices=list(codes),
        device=codes_column[first],
        seq=seqs[first],
        appended_ms=np.frombuffer(appended, np.int64)[first],
        event_ms=np.frombuffer(event, np.int64)[first],
        identities=identities,
        records=records,
        unparseable=unparseable,
    )


def dead_letters(records: Iterable[Any]) -> tuple[dict[str, set[int]], dict[str, int]]:
    """The dead-letter topic's readings the stream dropped as late (device -> seqs: they are
    accounted for), and the dead letters by ``stage:reason``."""
    late: dict[str, set[int]] = defaultdict(set)
    reasons: dict[str, int] = {}
    for record in records:
        try:
            letter = DeadLetter.of_message(record.value(), record.key(), record.headers())
        except ValueError as exc:  # counted, not fatal: the report says what the topic holds
            letter = DeadLetter("unreadable", str(exc), "unknown", record.value() or b"")
        key = f"{letter.stage}:{letter.reason}"
        reasons[key] = reasons.get(key, 0) + 1
        if key == "stream:late":
            body = json.loads(letter.original)
            late[body["device_id"]].add(int(body["seq"]))
    return dict(late), reasons


#: Ground-truth kinds whose seqs never reach the raw topic as readings: a dropout skips
#: them, a malformed payload is dead-lettered by the gateway (its seq may be unreadable).
NOT_IN_RAW = ("dropout", "malformed")


def declared_ranges(truth: list[Injection]) -> dict[str, list[tuple[int, int]]]:
    ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for event in truth:
        if event.kind in NOT_IN_RAW:
            ranges[event.device_id].append((event.start_seq, event.end_seq))
    return ranges


class Loss(msgspec.Struct, kw_only=True):
    """Where the run's readings went, by seq: ``loss`` counts the seqs missing at the
    transport (gaps in the raw topic no dropout declares) and in the pipeline (in the raw
    topic, neither archived nor dead-lettered as late); both must be 0. The gaps and missing
    seqs name at most 20 seqs a device."""

    devices: int
    unique_readings_in_kafka: int
    archived: int
    late: int
    declared_dropout_or_malformed_seqs: int
    loss: int
    transport_gaps: dict[str, list[int]]
    pipeline_missing: dict[str, list[int]]


def account(raw: Seqs, archived: Seqs, late: dict[str, set[int]], truth: list[Injection]) -> Loss:
    """Loss by seq at the transport and in the pipeline (both must be 0)."""
    dropouts = declared_ranges(truth)
    nothing = np.empty(0, np.int64)
    transport_gaps: dict[str, list[int]] = {}
    pipeline_missing: dict[str, list[int]] = {}
    for device, seqs in raw.items():
        declared = [np.arange(start, end + 1) for start, end in dropouts.get(device, [])]
        expected = np.setdiff1d(np.arange(int(seqs[-1]) + 1), np.concatenate([nothing, *declared]))
        missing = np.setdiff1d(expected, seqs, assume_unique=True)
        if len(missing):
            transport_gaps[device] = missing.tolist()
        accounted = np.union1d(archived.get(device, nothing), np.fromiter(late.get(device, ()), np.int64))
        missing = np.setdiff1d(seqs, accounted, assume_unique=True)
        if len(missing):
            pipeline_missing[device] = missing.tolist()
    lost = sum(len(v) for v in transport_gaps.values()) + sum(len(v) for v in pipeline_missing.values())
    return Loss(
        devices=len(raw),
        unique_readings_in_kafka=sum(len(s) for s in raw.values()),
        archived=sum(len(s) for s in archived.values()),
        late=sum(len(s) for s in late.values()),
        declared_dropout_or_malformed_seqs=sum(e - s + 1 for r in dropouts.values() for s, e in r),
        loss=lost,
        transport_gaps={device: seqs[:20] for device, seqs in transport_gaps.items()},
        pipeline_missing={device: seqs[:20] for device, seqs in pipeline_missing.items()},
    )


def archived_seqs(archive: Path) -> Seqs:
    """Device -> seqs present in the Parquet archive. Read a file at a time: the live job
    writes many small files (a file per partition, date and device type each micro-batch,
    about 150,000 in an hour's run), and a dataset over all of them holds every file's
    footer, gigabytes for the archive's wide schema."""
    import pyarrow.parquet as pq

    root = archive / "readings"
    codes: dict[str, int] = {}
    device: list[np.ndarray] = []
    seq: list[np.ndarray] = []
    for path in sorted(root.glob("**/*.parquet")) if root.exists() else []:
        table = pq.read_table(path, columns=["device_id", "seq"])
        encoded = table.column("device_id").combine_chunks().dictionary_encode()
        names = np.asarray(
            [codes.setdefault(str(name), len(codes)) for name in encoded.dictionary.to_pylist()], np.int32
        )
        device.append(names[encoded.indices.to_numpy()])
        seq.append(table.column("seq").to_numpy())
    if not codes:
        return {}
    devices, seqs = np.concatenate(device), np.concatenate(seq)
    first = _first_of_each_pair(devices, seqs)
    return _split(list(codes), devices[first], seqs[first])


def _first_of_each_pair(device: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """The index of each (device, seq) pair's first row, in the order of device, then seq."""
    order = np.lexsort((seq, device))  # stable: the first of equal pairs stays first
    device, seq = device[order], seq[order]
    first = np.ones(len(order), bool)
    first[1:] = (device[1:] != device[:-1]) | (seq[1:] != seq[:-1])
    return order[first]


def _split(names: list[str], device: np.ndarray, seq: np.ndarray) -> Seqs:
    """Device -> its seqs, from columns sorted by device code (``names[code]``)."""
    bounds = np.searchsorted(device, np.arange(len(names) + 1))
    return {
        name: seq[bounds[code] : bounds[code + 1]] for code, name in enumerate(names) if bounds[code + 1] > bounds[code]
    }
