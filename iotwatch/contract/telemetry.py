"""The device message contract every component shares (schema version 1).

docs/contract.md shows the payload and gives each limit with its reason. Validation is strict
on purpose: a bad message goes to the dead-letter topic with the reason from
:class:`ContractViolation`, it is never coerced into something it was not. When a payload
breaks several rules, the reason is that of the first broken rule in this order: size, UTF-8,
JSON syntax (including the nesting limit), top-level object, the fields in the order of
:class:`Telemetry` (a missing field where it stands), unknown fields, version, event time.

:func:`decode_telemetry` checks one payload; :func:`decode_batch` checks many at once into
columns for the streaming job, with the same reasons record by record.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import re
import sys
import time
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import msgspec
import numpy as np

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})

#: Larger payloads are rejected. A vehicle crash event carries a pre-event buffer
#: (5 s at 10 Hz of ~15 metrics is ~20 KB of JSON), so the limit leaves ample room.
MAX_PAYLOAD_BYTES = 256 * 1024
#: Event times further than this in the future (device clock skew) are contract violations.
MAX_FUTURE_SKEW_MS = 24 * 3600 * 1000
#: Event times before this (2000-01-01) are contract violations: an unset device clock.
MIN_EVENT_TIME_MS = 946_684_800_000
#: The most metrics one message may carry.
MAX_METRICS = 64
#: No JSON value may sit inside more arrays and objects than this.
MAX_JSON_DEPTH = 200
#: ``seq`` fits a signed 64-bit integer.
MAX_SEQ = 2**63 - 1
#: The ``event`` of a device's last reading before it stops cleanly (a goodbye): the job marks
#: the device offline instead of reporting it silent, until it is heard again. A device that
#: vanishes without it (its MQTT last will fires, or it just stops) is silent.
GOODBYE_EVENT = "offline"

# Patterns end in \Z, not $: msgspec matches with Python's re, where $ also matches before
# a final newline ("thermostat\n"), which the contract has always rejected.
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z"
#: Device types double as model-registry names (a directory each): models/registry.py uses it.
DEVICE_TYPE_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z"
#: Metric names: the same characters as registry names.
METRIC_NAME_PATTERN = DEVICE_TYPE_PATTERN

Name = Annotated[str, msgspec.Meta(pattern=_NAME_PATTERN)]
DeviceTypeName = Annotated[str, msgspec.Meta(pattern=DEVICE_TYPE_PATTERN)]
MetricName = Annotated[str, msgspec.Meta(pattern=METRIC_NAME_PATTERN)]
FiniteFloat = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
Metrics = Annotated[dict[MetricName, FiniteFloat], msgspec.Meta(max_length=MAX_METRICS)]


class DeviceType(StrEnum):
    """Kinds of device the simulators produce and the pipeline knows ranges for."""

    THERMOSTAT = "thermostat"
    SMART_METER = "smart_meter"
    AIR_QUALITY = "air_quality"
    DOOR_SENSOR = "door_sensor"
    LEAK_SENSOR = "leak_sensor"
    VEHICLE_EDR = "vehicle_edr"


class Telemetry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One reading. Unknown top-level fields are rejected so typos surface.

    Decoding (:func:`decode_telemetry`, :func:`decode_batch`) validates; constructing one
    in code does not (build readings from trusted values, or ``msgspec.convert`` a dict).
    """

    v: int
    device_id: Name  # the device, unique in the fleet
    device_type: DeviceTypeName  # its kind: the metric catalogue's key
    site: Name  # the home or vehicle fleet it belongs to
    seq: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]  # per-device counter from 0, +1 a message
    ts: Annotated[int, msgspec.Meta(description="event time, epoch milliseconds")]
    metrics: Metrics  # metric name (its unit in the name) -> value
    event: Name | None = None  # a discrete event, e.g. door_open, crash
    event_data: dict[str, Any] | None = None  # the event's details, e.g. a crash's pre-event buffer

    def key(self) -> bytes:
        """The Kafka message key: per-device order holds within a partition."""
        return self.device_id.encode()

    def to_json(self) -> bytes:
        """Compact JSON, fields in order, ``None`` fields left out; numbers as Python's
        ``json`` writes them (metric values as floats)."""
        body = msgspec.structs.asdict(self)
        body["metrics"] = {name: float(value) for name, value in self.metrics.items()}
        return _dumps({name: value for name, value in body.items() if value is not None}).encode()


_dumps = json.JSONEncoder(separators=(",", ":")).encode
_FIELDS = msgspec.structs.fields(Telemetry)
_FIELD_NAMES = frozenset(field.encode_name for field in _FIELDS)


class ContractViolation(ValueError):
    """A payload that does not follow the contract; ``reason`` is a short stable code
    (for counting and dashboards) and ``detail`` says what exactly was wrong."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def decode_telemetry(
    raw: bytes,
    *,
    now_ms: int | None = None,
    max_bytes: int = MAX_PAYLOAD_BYTES,
    max_future_skew_ms: int = MAX_FUTURE_SKEW_MS,
    metrics_of: Mapping[str, frozenset[str]] | None = None,
) -> Telemetry:
    """Parse and validate a payload, or raise :class:`ContractViolation`. With ``metrics_of``
    (device type -> the metrics it has, :data:`iotwatch.contract.metric_catalog.KNOWN_METRICS`)
    a reading of a listed type carrying another metric is ``unknown_metric``."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    message = _decode(raw, max_bytes, now + max_future_skew_ms, max_future_skew_ms)
    if metrics_of is not None:
        check_metrics(message, metrics_of)
    return message


def check_metrics(message: Any, metrics_of: Mapping[str, frozenset[str]]) -> None:
    """``unknown_metric`` when ``message`` (Telemetry or its twin) carries a metric its device
    type does not have: it would be archived and scored as a reading of that type."""
    known = metrics_of.get(message.device_type)
    if known is None or message.metrics.keys() <= known:
        return
    foreign = sorted(set(message.metrics) - known)
    raise ContractViolation(
        "unknown_metric",
        f"metrics: a {message.device_type} has no {', '.join(foreign)} (it has {', '.join(sorted(known))})",
    )


def _decode(raw: bytes, max_bytes: int, latest_ts: int, max_future_skew_ms: int) -> Telemetry:
    if len(raw) > max_bytes:
        raise ContractViolation("too_large", f"{len(raw)} bytes > limit {max_bytes}")
    wire = _decode_wire(raw)
    message = _diagnose(raw) if wire is None else Telemetry(*_astuple(wire))
    if not _current(message, latest_ts):
        if message.v not in SUPPORTED_VERSIONS:
            raise ContractViolation("unsupported_version", f"v={message.v}, supported {sorted(SUPPORTED_VERSIONS)}")
        if message.ts > latest_ts:
            raise ContractViolation("ts_in_future", f"ts={message.ts} is more than {max_future_skew_ms} ms ahead")
        raise ContractViolation("ts_too_old", f"ts={message.ts} is before 2000-01-01")
    return message


def _current(message: Any, latest_ts: int) -> bool:
    """A supported version and a plausible event time (``message``: Telemetry or its twin)."""
    return message.v in SUPPORTED_VERSIONS and MIN_EVENT_TIME_MS <= message.ts <= latest_ts


# --- the fast path ---------------------------------------------------------------------
#
# msgspec checks a Meta pattern with a Python regex call per string, which costs more than
# all the rest of decoding. The fast path therefore decodes into a twin of Telemetry
# derived from it without the patterns, and matches each name once per process: a name
# seen before is a set lookup. Whatever the twin or a pattern refuses goes to _diagnose.

#: Names remembered per pattern; past this many (a flood of one-off names) it starts over.
_MAX_KNOWN_NAMES = 100_000


class _KnownNames:
    """The strings that matched the pattern of ``kind`` (an Annotated str) so far."""

    def __init__(self, kind: Any) -> None:
        self.search = re.compile(typing.get_args(kind)[1].pattern).search
        self.seen: set[str] = set()

    def learn(self, value: str) -> bool:
        """Whether ``value`` matches; remembered if so."""
        if self.search(value) is None:
            return False
        if len(self.seen) >= _MAX_KNOWN_NAMES:
            self.seen.clear()
        self.seen.add(value)
        return True


_NAMES = _KnownNames(Name)
_DEVICE_TYPES = _KnownNames(DeviceTypeName)
_METRIC_NAMES = _KnownNames(MetricName)


def _names_match(wire: Any) -> bool:
    """Whether the names in ``wire`` (the twin) match the patterns of their Telemetry fields.
    tests/unit/iotwatch/test_contract.py checks that each patterned field is covered here."""
    names, device_types, metrics = _NAMES.seen, _DEVICE_TYPES.seen, _METRIC_NAMES.seen
    if (
        wire.device_id in names
        and wire.site in names
        and wire.device_type in device_types
        and metrics.issuperset(wire.metrics)
        and (wire.event is None or wire.event in names)
    ):
        return True
    return (
        _NAMES.learn(wire.device_id)
        and _NAMES.learn(wire.site)
        and _DEVICE_TYPES.learn(wire.device_type)
        and all(map(_METRIC_NAMES.learn, wire.metrics))
        and (wire.event is None or _NAMES.learn(wire.event))
    )


def _without_patterns(kind: Any) -> Any:
    """``kind`` (an annotation of Telemetry) with every Meta pattern left out."""
    args = typing.get_args(kind)
    origin = typing.get_origin(kind)
    if origin is Annotated:
        metas = []
        for meta in kind.__metadata__:
            if isinstance(meta, msgspec.Meta) and meta.pattern is not None:
                kept = {k: getattr(meta, k) for k in _META_ATTRIBUTES if getattr(meta, k) is not None}
                if not kept:
                    continue
                meta = msgspec.Meta(**kept)
            metas.append(meta)
        base = _without_patterns(args[0])
        return Annotated[(base, *metas)] if metas else base
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_without_patterns(arg) for arg in args)]  # noqa: UP007 (built from a tuple)
    if origin is dict:
        return types.GenericAlias(dict, (_without_patterns(args[0]), _without_patterns(args[1])))
    return kind


_META_ATTRIBUTES = (
    "gt",
    "ge",
    "lt",
    "le",
    "multiple_of",
    "min_length",
    "max_length",
    "tz",
    "title",
    "description",
    "examples",
    "extra_json_schema",
    "extra",
)
# gc=False: a batch holds on to many; a decoded message cannot be part of a reference cycle.
_WIRE = msgspec.defstruct(
    "_WireTelemetry",
    [(f.name, _without_patterns(f.type), f.default) for f in _FIELDS],
    frozen=True,
    forbid_unknown_fields=True,
    omit_defaults=True,
    gc=False,
)
_WIRE_DECODER = msgspec.json.Decoder(_WIRE)
_astuple = msgspec.structs.astuple


def _decode_wire(raw: bytes) -> Any:
    """The twin of the message in ``raw`` if it follows the contract but maybe for version
    and event time; None when it may not (then :func:`_diagnose` decides)."""
    if len(raw) > 2 * MAX_JSON_DEPTH and _needs_diagnosis(raw):
        return None
    wire = _wire_or_none(raw)
    return wire if wire is not None and _names_match(wire) else None


# --- the reason for a payload the fast decoder refused ---------------------------------
#
# msgspec stops at the first problem in document order; the reason must not depend on the
# order of keys, so a refused payload is parsed again, plainly, and checked rule by rule in
# the documented order, each field against its own type in Telemetry. That second look also
# decides what msgspec cannot see or refuses although it is valid: whether a value nests
# too deeply (also under a key that a later duplicate replaces, which msgspec drops), and a
# duplicate key whose later value replaces an invalid one (valid, as it always was).

#: Integers of more digits are invalid JSON (Python's int limit; also in a float's integer
#: part, as in the parser the contract used before).
_MAX_DIGITS = 4300
_LONG_NUMBER = re.compile(rb"[0-9]{%d}" % (_MAX_DIGITS + 1))


def _needs_diagnosis(raw: bytes) -> bool:
    """Whether ``raw`` may hold what msgspec reads but the contract refuses: nesting deeper
    than the limit (more brackets than the limit, open and closed: twice as many bytes),
    or a number of too many digits."""
    return len(raw) > 2 * MAX_JSON_DEPTH and (
        raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH
        or (len(raw) > _MAX_DIGITS and _LONG_NUMBER.search(raw) is not None)
    )


def _diagnose(raw: bytes) -> Telemetry:
    """The message in ``raw``, or the :class:`ContractViolation` of its first broken rule."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractViolation("invalid_utf8", str(exc)) from None
    doc = _parse(text)
    if type(doc) is not dict:
        raise ContractViolation("not_an_object", f"payload: expected an object, got {_kind(doc)}")
    for field in _FIELDS:
        if field.encode_name in doc:
            _check_field(field.encode_name, field.type, doc[field.encode_name])
        elif field.required:
            raise ContractViolation("missing_field", f"{field.encode_name}: field required")
    for name in doc:
        if name not in _FIELD_NAMES:
            raise ContractViolation("unknown_field", f"{name}: unknown field")
    try:
        return msgspec.convert(doc, Telemetry)
    except msgspec.ValidationError as exc:  # every field passed above: not expected
        raise ContractViolation("invalid_field", str(exc)) from None


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs, duplicate keys included."""


def _parse(text: str) -> Any:
    """Any JSON document, reading NaN/Infinity literals and numbers beyond the float range
    as floats (they are ``non_finite_number`` where a field holds them)."""
    try:
        pairs = json.loads(text, object_pairs_hook=_Pairs, parse_float=_float)
    except RecursionError:
        raise ContractViolation("invalid_json", f"payload: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # also an integer of more than 4300 digits
        raise ContractViolation("invalid_json", f"payload: {exc}") from None
    for value, depth in _values(pairs):
        if depth > MAX_JSON_DEPTH:
            raise ContractViolation("invalid_json", f"payload: nested deeper than {MAX_JSON_DEPTH} levels")
        if type(value) is str and _LONE_SURROGATE.search(value):
            raise ContractViolation("invalid_json", f"payload: lone surrogate escape in {value!r}")
    return json.loads(text, parse_float=_float)  # objects as dicts: the last of duplicate keys wins


def _float(token: str) -> float:
    if len(token) > _MAX_DIGITS and len(re.split("[.eE]", token.lstrip("-"), maxsplit=1)[0]) > _MAX_DIGITS:
        raise ValueError(f"number with more than {_MAX_DIGITS} digits before the point")
    return float(token)


def _check_field(name: str, kind: Any, value: Any) -> None:
    if name == "metrics" and type(value) is dict:
        if len(value) > MAX_METRICS:
            raise ContractViolation("too_many_metrics", f"metrics: {len(value)} entries > limit {MAX_METRICS}")
        for metric, number in value.items():
            _convert(metric, MetricName, f"metrics.{metric}[key]")
            if _is_non_finite(number):
                raise ContractViolation("non_finite_number", f"metrics.{metric}: {number!r} is not a finite number")
            _convert(number, FiniteFloat, f"metrics.{metric}")
        return
    _convert(value, kind, name)
    if name == "event_data" and any(_is_non_finite(item) for item, _ in _values(value)):
        raise ContractViolation("non_finite_number", "event_data: holds a number that is not finite")


def _convert(value: Any, kind: Any, where: str) -> None:
    try:
        msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise ContractViolation("invalid_field", f"{where}: {exc}") from None


def _is_non_finite(value: Any) -> bool:
    if type(value) is float:
        return not math.isfinite(value)
    if type(value) is int:
        try:
            float(value)
        except OverflowError:
            return True
    return False


def _values(doc: Any) -> Iterator[tuple[Any, int]]:
    """Every value and object key in ``doc`` with the number of arrays and objects it sits
    in; depth first, without recursion. Nothing below a value nested too deeply."""
    stack = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        yield value, depth
        if depth > MAX_JSON_DEPTH:
            continue
        kind = type(value)
        if kind is _Pairs:
            stack.extend((item, depth + 1) for pair in value for item in pair)
        elif kind is dict:
            stack.extend((item, depth + 1) for pair in value.items() for item in pair)
        elif kind is list:
            stack.extend((item, depth + 1) for item in value)


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


# --- many records at once, for the streaming job -----------------------------------------

_NONE = np.array(None, dtype=object)  # None as an array, so comparing an object column with it is elementwise


@dataclass(frozen=True)
class DecodedBatch:
    """Columns for ``n`` records: one entry per record, and the metrics of the valid ones
    flattened (``metric_row`` is the record's index; record order, then the message's
    key order). An invalid record has its ``reason`` and ``detail``, ``None`` in the
    string columns and 0 in ``seq`` and ``ts``."""

    reason: np.ndarray  # object: None when valid, else the ContractViolation reason
    detail: np.ndarray  # object: None when valid, else the ContractViolation detail
    device_id: np.ndarray  # object: str or None
    device_type: np.ndarray  # object: str or None
    site: np.ndarray  # object: str or None
    event: np.ndarray  # object: str or None (also None for a valid record without an event)
    seq: np.ndarray  # int64
    ts: np.ndarray  # int64, event time in epoch milliseconds
    metric_row: np.ndarray  # int64
    metric_name: np.ndarray  # object: str
    metric_value: np.ndarray  # float64

    def __len__(self) -> int:
        return len(self.reason)

    @property
    def valid(self) -> np.ndarray:
        """Boolean mask of the records that follow the contract."""
        return np.asarray(np.equal(self.reason, _NONE), dtype=np.bool_)


def decode_batch(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    *,
    now_ms: int | None = None,
    metrics_of: Mapping[str, frozenset[str]] | None = None,
) -> DecodedBatch:
    """Decode Kafka records into columns; each record gets the reason :func:`decode_telemetry`
    gives its value (``None`` reads as ``b""``, ``metrics_of`` as there), and a valid record whose
    key (UTF-8, when not empty) is not its ``device_id`` is ``key_mismatch``. ``now_ms`` is read
    once per batch.

    The usual record costs no Python of its own beyond msgspec's decode: every check runs on
    the batch's columns (:func:`_checked_in_bulk`), and only a record one of them refuses is
    decoded again, alone, for its reason (or accepted by the diagnosis)."""
    n = len(values)
    if keys is not None and len(keys) != n:
        raise ValueError(f"{len(keys)} keys for {n} values")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    latest_ts = now + MAX_FUTURE_SKEW_MS
    reason, detail = np.full(n, None, dtype=object), np.full(n, None, dtype=object)
    messages, redo, columns = _checked_in_bulk(values, keys, latest_ts, metrics_of)
    for i in redo.tolist():
        raw, key = values[i] or b"", None if keys is None else keys[i]
        try:  # the reason, or valid after all (a message only the diagnosis accepts)
            message = _decode(raw, MAX_PAYLOAD_BYTES, latest_ts, MAX_FUTURE_SKEW_MS)
            if key and key != message.device_id.encode():
                raise ContractViolation(
                    "key_mismatch", f"Kafka key {key.decode(errors='replace')!r} != device_id {message.device_id!r}"
                )
            if metrics_of is not None:
                check_metrics(message, metrics_of)
        except ContractViolation as exc:
            reason[i], detail[i], messages[i] = exc.reason, exc.detail, None
            continue
        messages[i] = message
    at = np.arange(n, dtype=np.int64)
    if len(redo):  # (else every record is valid, and the checks' columns are the batch's)
        at = np.flatnonzero(np.fromiter((m is not None for m in messages), dtype=bool, count=n))
        columns = _columns([messages[i] for i in at.tolist()])
    return DecodedBatch(
        reason=reason,
        detail=detail,
        **{name: _scatter(n, at, columns[name], None) for name in ("device_id", "device_type", "site", "event")},
        seq=_scatter(n, at, columns["seq"], 0),
        ts=_scatter(n, at, columns["ts"], 0),
        metric_row=np.repeat(at, columns["counts"]),
        metric_name=_objects(columns["names"]),
        metric_value=np.fromiter(
            itertools.chain.from_iterable(map(dict.values, columns["metrics"])),
            dtype=np.float64,
            count=len(columns["names"]),
        ),
    )


def _columns(messages: list[Any]) -> dict[str, Any]:
    """The messages' fields as lists, their metrics' names flattened, and how many each has."""
    columns: dict[str, Any] = {name: list(map(operator.attrgetter(name), messages)) for name in _FIELD_ATTRIBUTES}
    columns["names"] = list(itertools.chain.from_iterable(columns["metrics"]))
    columns["counts"] = np.fromiter(map(len, columns["metrics"]), dtype=np.int64, count=len(messages))
    return columns


_FIELD_ATTRIBUTES = ("v", "device_id", "device_type", "site", "seq", "ts", "metrics", "event")


def _wire_or_none(raw: bytes | None) -> Any:
    """The twin msgspec decodes from ``raw``, None where it refuses."""
    try:
        return _WIRE_DECODER.decode(raw or b"")
    except (ValueError, RecursionError):  # msgspec's DecodeError/ValidationError, UnicodeDecodeError
        return None


def _checked_in_bulk(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
    latest_ts: int,
    metrics_of: Mapping[str, frozenset[str]] | None,
) -> tuple[list[Any], np.ndarray, dict[str, Any]]:
    """Each record's twin, the records (positions) whose twin is missing or breaks a rule --
    size, nesting, names, version, event time, key, metrics -- checked on columns (those go
    through :func:`_decode` alone, as they did when every record did), and the columns of
    the decoded ones (:func:`_columns`)."""
    n = len(values)
    try:  # one call per record and nothing else, while every record decodes
        decode = _WIRE_DECODER.decode
        wires: list[Any] = [decode(raw) for raw in values]  # type: ignore[arg-type]  # None: TypeError
    except (ValueError, RecursionError, TypeError):
        wires = list(map(_wire_or_none, values))
    refused = np.fromiter((w is None for w in wires), dtype=bool, count=n)
    sizes = np.fromiter((0 if raw is None else len(raw) for raw in values), dtype=np.int64, count=n)
    for i in np.flatnonzero((sizes > 2 * MAX_JSON_DEPTH) & ~refused).tolist():
        refused[i] = sizes[i] > MAX_PAYLOAD_BYTES or _needs_diagnosis(values[i])  # type: ignore[arg-type]  # not None: decoded
    rows = np.flatnonzero(~refused)
    columns = _columns([wires[i] for i in rows.tolist()] if len(rows) < n else wires)
    bad = np.zeros(len(rows), dtype=bool)  # of the decoded ones
    for patterned, name in ((_NAMES, "device_id"), (_NAMES, "site"), (_NAMES, "event"), (_DEVICE_TYPES, "device_type")):
        bad |= _unmatched(patterned, columns[name])
    entry_row = np.repeat(np.arange(len(rows)), columns["counts"])
    bad[entry_row[_unmatched(_METRIC_NAMES, columns["names"])]] = True
    if not SUPPORTED_VERSIONS.issuperset(columns["v"]):
        bad |= np.fromiter((v not in SUPPORTED_VERSIONS for v in columns["v"]), dtype=bool, count=len(rows))
    bad |= ~_within(columns["ts"], MIN_EVENT_TIME_MS, latest_ts)
    if keys is not None:  # (an empty key is not checked)
        given = list(keys) if len(rows) == n else [keys[i] for i in rows.tolist()]
        differs = _objects(given) != _objects([d.encode() for d in columns["device_id"]])
        bad |= differs & np.fromiter(map(bool, given), dtype=bool, count=len(given))
    if metrics_of is not None:
        bad |= _foreign(metrics_of, columns["device_type"], columns["metrics"], set(columns["names"]))
    refused[rows[bad]] = True
    return wires, np.flatnonzero(refused), columns


def _unmatched(patterned: _KnownNames, column: list[Any]) -> np.ndarray:
    """Which entries of ``column`` (strings, or None: no name) break ``patterned``'s pattern:
    each distinct string matched once."""
    unknown = set(column) - patterned.seen
    unknown.discard(None)
    failed = {name for name in unknown if not patterned.learn(name)}
    if not failed:
        return np.zeros(len(column), dtype=bool)
    return np.fromiter((name in failed for name in column), dtype=bool, count=len(column))


def _within(column: list[int], low: int, high: int) -> np.ndarray:
    """Which of ``column``'s integers lie in ``[low, high]`` (any size of integer)."""
    try:
        values = np.array(column, dtype=np.int64)
    except OverflowError:
        return np.fromiter((low <= value <= high for value in column), dtype=bool, count=len(column))
    return (values >= low) & (values <= high)


def _foreign(
    metrics_of: Mapping[str, frozenset[str]], device_type: list[str], metrics: list[dict[str, float]], names: set[str]
) -> np.ndarray:
    """Which records carry a metric that their type, listed in ``metrics_of``, does not have
    (``names``: all the metrics they carry); none to look at when each type has them all."""
    known_of = {kind: metrics_of.get(kind) for kind in set(device_type)}
    if all(known is None or names <= known for known in known_of.values()):
        return np.zeros(len(metrics), dtype=bool)
    pairs = zip(map(known_of.__getitem__, device_type), metrics, strict=True)
    return np.fromiter((k is not None and not m.keys() <= k for k, m in pairs), bool, len(metrics))


def _scatter(n: int, at: np.ndarray, values: list[Any], missing: Any) -> np.ndarray:
    """The column of ``n`` records: ``values`` at rows ``at``, ``missing`` (None or 0) elsewhere."""
    if len(values) == n:  # all valid, the usual case
        return _objects(values) if missing is None else np.array(values, dtype=np.int64)
    if missing is None:
        column = np.full(n, None, dtype=object)
        column[at] = _objects(values)
    else:
        column = np.zeros(n, dtype=np.int64)
        column[at] = values
    return column


def _objects(items: list[Any]) -> np.ndarray:
    column = np.empty(len(items), dtype=object)
    column[:] = items
    return column
