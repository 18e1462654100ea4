"""The message contract: its wire form, every reason code, its limits, and the bulk decoder."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import msgspec
import numpy as np
import pytest

from iotwatch.contract.alerts import (
    ALERT_SCHEMA_VERSION,
    AlertLifecycle,
    AlertRecord,
    BadAlert,
    Contributor,
    Severity,
    alert_as_dict,
    decode_alert,
    encode_alert,
)
from iotwatch.contract.telemetry import (
    DEVICE_TYPE_PATTERN,
    MAX_METRICS,
    MAX_PAYLOAD_BYTES,
    ContractViolation,
    DecodedBatch,
    Telemetry,
    decode_batch,
    decode_telemetry,
)
from iotwatch.devices.anomaly_kinds import MALFORMED_VARIANTS
from iotwatch.devices.config import SimConfig
from iotwatch.devices.faults import corrupt
from iotwatch.devices.simulation import STATUS
from iotwatch.models.registry import ModelRegistry, RegistryError
from iotwatch.models.robust_zscore import RobustZScore
from tests.support.devices import START_MS, generate

NOW = START_MS + 60_000
HOUR = 3_600_000

FIELDS: dict[str, Any] = {
    "v": 1,
    "device_id": "home-003-thermostat-0",
    "device_type": "thermostat",
    "site": "home-003",
    "seq": 41,
    "ts": START_MS,
    "metrics": {"temperature_c": 21.4, "humidity_pct": 43.0},
}


def payload(**changes: Any) -> bytes:
    """A valid reading with ``changes`` (a value of ... leaves the field out), as compact JSON."""
    body = {**FIELDS, **changes}
    return json.dumps({k: v for k, v in body.items() if v is not ...}, separators=(",", ":")).encode()


def raw(**literals: str) -> bytes:
    """A valid reading with fields replaced by JSON text (for what json.dumps cannot write)."""
    body = {k: json.dumps(v) for k, v in FIELDS.items()} | literals
    return ("{" + ",".join(f'"{k}":{v}' for k, v in body.items()) + "}").encode()


def reason(data: bytes | None, max_bytes: int = MAX_PAYLOAD_BYTES) -> str | None:
    try:
        decode_telemetry(b"" if data is None else data, now_ms=NOW, max_bytes=max_bytes)
    except ContractViolation as exc:
        return exc.reason
    return None


# --- the wire form ---------------------------------------------------------------------


def _old_to_json(message: Telemetry) -> bytes:
    """What the pydantic model wrote: model_dump(exclude_none=True), compact."""
    body = msgspec.structs.asdict(message)
    body["metrics"] = {k: float(v) for k, v in body["metrics"].items()}
    return json.dumps({k: v for k, v in body.items() if v is not None}, separators=(",", ":")).encode()


def test_to_json_is_the_compact_form_byte_for_byte() -> None:
    message = Telemetry(
        v=1,
        device_id="home-003-thermostat-0",
        device_type="thermostat",
        site="home-003",
        seq=41,
        ts=1763784000000,
        metrics={"temperature_c": 21.4, "humidity_pct": 43.0},
    )
    assert message.to_json() == (
        b'{"v":1,"device_id":"home-003-thermostat-0","device_type":"thermostat",'
        b'"site":"home-003","seq":41,"ts":1763784000000,'
        b'"metrics":{"temperature_c":21.4,"humidity_pct":43.0}}'
    )
    assert message.key() == b"home-003-thermostat-0"
    event = Telemetry(
        v=1,
        device_id="v-1",
        device_type="vehicle_edr",
        site="fleet",
        seq=0,
        ts=5,
        metrics={"z": 1e-05, "big": 1.2345678901234568e17, "n": -0.0, "i": 1},
        event="crash",
        event_data={"a": None, "b": [None, 1, 2.5e-07], "\u00e9": "\u00fc\x01"},
    )
    assert event.to_json() == (
        b'{"v":1,"device_id":"v-1","device_type":"vehicle_edr","site":"fleet","seq":0,"ts":5,'
        b'"metrics":{"z":1e-05,"big":1.2345678901234568e+17,"n":-0.0,"i":1.0},"event":"crash",'
        b'"event_data":{"a":null,"b":[null,1,2.5e-07],"\\u00e9":"\\u00fc\\u0001"}}'
    )
    assert Telemetry(**{**FIELDS, "event_data": {}}).to_json().endswith(b',"event_data":{}}')
    moved = msgspec.structs.replace(message, ts=7)
    assert (
        moved.ts == 7
        and message.ts == 1763784000000
        and moved.to_json() == message.to_json().replace(b'"ts":1763784000000', b'"ts":7')
    )


def test_simulator_messages_round_trip_to_the_same_bytes() -> None:
    config = SimConfig(seed=3, homes=4, vehicles=2, start_ms=START_MS)
    for _, _, text, group in generate(config, 20):
        if group == STATUS:
            continue
        message = decode_telemetry(text.encode(), now_ms=NOW)
        assert message.to_json() == _old_to_json(message)
        assert decode_telemetry(message.to_json(), now_ms=NOW) == message


# --- every reason ----------------------------------------------------------------------

INVALID: dict[str, bytes] = {
    "too_large": payload(event_data={"pad": "x" * 300_000}),
    "invalid_utf8": payload()[:-2] + b"\xff\xfe}",
    "invalid_json": payload()[:40],
    "not_an_object": b'[{"v":1}]',
    "missing_field": payload(seq=...),
    "unknown_field": payload(firmware="1.2.3"),
    "non_finite_number": raw(metrics='{"temperature_c":NaN}'),
    "invalid_field": payload(seq="41"),
    "unsupported_version": payload(v=2),
    "ts_in_future": payload(ts=NOW + 25 * HOUR),
    "ts_too_old": payload(ts=946_684_799_999),
    "too_many_metrics": payload(metrics={f"m{i}": 1.0 for i in range(MAX_METRICS + 1)}),
}


@pytest.mark.parametrize("code", sorted(INVALID))
def test_every_reason_code(code: str) -> None:
    with pytest.raises(ContractViolation) as caught:
        decode_telemetry(INVALID[code], now_ms=NOW)
    assert caught.value.reason == code and caught.value.detail
    assert str(caught.value).startswith(f"{code}: ")


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", "invalid_json"),
        (b"  ", "invalid_json"),
        (payload() + b"x", "invalid_json"),
        (payload() + b"{}", "invalid_json"),
        (b"\xef\xbb\xbf" + payload(), "invalid_json"),
        (raw(site='"\\ud800"'), "invalid_json"),
        (raw(site='"\\udc00x"'), "invalid_json"),
        (raw(metrics='{"t":01}'), "invalid_json"),
        (raw(metrics='{"t":-NaN}'), "invalid_json"),
        (raw(ts="1" * 4301), "invalid_json"),
        (raw(metrics='{"t":%s.0}' % ("1" * 4301)), "invalid_json"),
        (b'"x"', "not_an_object"),
        (b"12", "not_an_object"),
        (b"null", "not_an_object"),
        (b"NaN", "not_an_object"),
        (raw(metrics='{"t":Infinity}'), "non_finite_number"),
        (raw(metrics='{"t":-Infinity}'), "non_finite_number"),
        (raw(metrics='{"t":1e400}'), "non_finite_number"),
        (raw(metrics='{"t":%s}' % ("1" * 400)), "non_finite_number"),
        (raw(event_data='{"a":[1,{"b":NaN}]}'), "non_finite_number"),
        (payload(seq=41.0), "invalid_field"),
        (raw(seq="41e0"), "invalid_field"),
        (payload(seq=True), "invalid_field"),
        (payload(seq=None), "invalid_field"),
        (payload(v="1"), "invalid_field"),
        (payload(v=1.0), "invalid_field"),
        (raw(seq="Infinity"), "invalid_field"),
        (payload(ts=1.7e12), "invalid_field"),
        (payload(metrics={"t": "21"}), "invalid_field"),
        (payload(metrics={"t": True}), "invalid_field"),
        (payload(metrics={"t": None}), "invalid_field"),
        (payload(metrics=[]), "invalid_field"),
        (payload(device_id="home 3"), "invalid_field"),
        (payload(device_id="home-3\n"), "invalid_field"),
        (payload(device_id="_home"), "invalid_field"),
        (payload(device_id="a" * 129), "invalid_field"),
        (payload(device_id="h\u00e9"), "invalid_field"),
        (payload(site=""), "invalid_field"),
        (payload(event="a b"), "invalid_field"),
        (payload(event_data=[1]), "invalid_field"),
        (payload(ts=10**30), "ts_in_future"),
        (payload(ts=-(10**30)), "ts_too_old"),
        (payload(v=10**30), "unsupported_version"),
        (payload(v=2, ts=NOW + 25 * HOUR), "unsupported_version"),
    ],
)
def test_reasons_of_edge_cases(data: bytes, code: str) -> None:
    assert reason(data) == code


@pytest.mark.parametrize(
    "data",
    [
        payload(),
        payload(device_id="home:3", event="crash", event_data={"a": [1, 2.5, {"b": None}]}),
        payload(device_id="a" * 128),
        payload(metrics={}),
        payload(metrics={"t": 21}),
        raw(seq="-0"),
        raw(metrics='{"t":1E5}'),
        raw(metrics='{"t":%s}' % ("1" * 30)),
        payload(event=None, event_data=None),
        raw(site='"home\\u002d003"'),
        payload(event_data={"big": 10**30}),
        raw(event_data='{"s":"\\ud83d\\ude00"}'),
        payload() + b" \n\t\r",
    ],
)
def test_valid_edge_cases(data: bytes) -> None:
    assert reason(data) is None


def test_strict_types_and_numbers() -> None:
    message = decode_telemetry(payload(metrics={"t": 21, "u": 21.5}), now_ms=NOW)
    assert message.metrics == {"t": 21.0, "u": 21.5} and type(message.metrics["t"]) is float
    assert decode_telemetry(raw(seq="-0"), now_ms=NOW).seq == 0


def test_the_first_broken_rule_decides_whatever_the_key_order() -> None:
    def shuffled(data: bytes, seed: int) -> bytes:
        items = list(json.loads(data).items())
        random.Random(seed).shuffle(items)
        return json.dumps(dict(items), separators=(",", ":")).encode()

    cases = {
        payload(firmware="x", seq="41"): "invalid_field",  # fields before unknown fields
        payload(v=..., seq="41"): "missing_field",  # in field order: v comes first
        payload(seq="x", metrics={"t": True}): "invalid_field",
        payload(ts=..., firmware=1): "missing_field",
        payload(v=2, firmware=1): "unknown_field",  # version after the fields
        payload(device_type="a:b", metrics={f"m{i}": 1.0 for i in range(70)}): "invalid_field",
        payload(seq=-1, ts=NOW + 25 * HOUR): "invalid_field",
        payload(metrics={f"m{i}": True for i in range(70)}): "too_many_metrics",  # the count before the entries
    }
    for data, code in cases.items():
        for seed in range(6):
            assert reason(shuffled(data, seed)) == code, (data, seed)
    assert reason(raw(v="null", metrics='{"t":NaN}')) == "invalid_field"
    nan_then_missing_ts = raw(metrics='{"t":NaN}').replace(f'"ts":{START_MS},'.encode(), b"")
    assert reason(nan_then_missing_ts) == "missing_field"
    assert reason(raw(metrics='{"a b":NaN}')) == "invalid_field"  # an entry's name before its value
    assert reason(raw(metrics='{"t":NaN,"a b":1}')) == "non_finite_number"  # entries in order


def test_duplicate_keys_the_last_one_counts() -> None:
    assert decode_telemetry(payload().replace(b'"seq":41', b'"seq":"x","seq":42'), now_ms=NOW).seq == 42
    assert reason(payload().replace(b'"seq":41', b'"seq":42,"seq":"x"')) == "invalid_field"
    assert reason(raw(event_data='{"a":NaN},"event_data":null')) is None
    deep = "[" * 300 + "]" * 300
    assert reason(raw(event_data=f'{{"a":{deep},"a":1}}')) == "invalid_json"  # parsed, so too deep all the same


# --- the limits ------------------------------------------------------------------------


def test_seq_fits_int64() -> None:
    assert decode_telemetry(payload(seq=2**63 - 1), now_ms=NOW).seq == 2**63 - 1
    assert reason(payload(seq=0)) is None
    for bad in (2**63, 2**64, 10**30, -1):
        assert reason(payload(seq=bad)) == "invalid_field", bad


def test_device_type_is_a_registry_name(tmp_path: Any) -> None:
    for good in ("thermostat", "smart_meter", "_x", "a.b-c", "a" * 128):
        assert reason(payload(device_type=good)) is None, good
    for bad in ("a:b", "a b", "", "-x", ".x", "a/b", "a" * 129, "thermostat\n"):
        assert reason(payload(device_type=bad)) == "invalid_field", bad
    registry = ModelRegistry(tmp_path)
    for name in ("a:b", "thermostat\n"):
        with pytest.raises(RegistryError):
            registry.register(RobustZScore(), name)
    import iotwatch.models.registry

    assert iotwatch.models.registry._NAME.pattern == DEVICE_TYPE_PATTERN


def test_metrics_count_names_and_values() -> None:
    assert reason(payload(metrics={f"m{i}": 1.0 for i in range(MAX_METRICS)})) is None
    for count in (MAX_METRICS + 1, 1000, 12_000):
        assert reason(payload(metrics={f"m{i}": 1.0 for i in range(count)})) == "too_many_metrics", count
    for bad in ("a b", "a:b", "", "-t", "t\n", "\u00e9", "a" * 129):
        assert reason(payload(metrics={"ok": 1.0, bad: 1.0})) == "invalid_field", bad
    for good in ("_t", "temperature_c", "a.b-c", "a" * 128):
        assert reason(payload(metrics={good: 1.0})) is None, good


def test_size_and_nesting_limits() -> None:
    assert reason(payload(event_data={"pad": "x" * 2_000_000})) == "too_large"
    assert reason(payload(event_data={"pad": "x" * 200_000})) is None
    for data in (
        b"[" * 100_000 + b"]" * 100_000,
        raw(event_data='{"a":' + "[" * 100_000 + "]" * 100_000 + "}"),
        raw(event_data='{"a":' + "[" * 100_000),
    ):
        assert reason(data) == "invalid_json"  # not a RecursionError
    assert reason(b'{"a":' * 100_000 + b"1" + b"}" * 100_000, max_bytes=1 << 20) == "invalid_json"
    # no value inside more than 200 arrays and objects (the top-level object and event_data count)
    assert reason(raw(event_data='{"a":' + "[" * 198 + "1" + "]" * 198 + "}")) is None
    assert reason(raw(event_data='{"a":' + "[" * 199 + "1" + "]" * 199 + "}")) == "invalid_json"
    assert reason(raw(event_data='{"a":' + "[" * 199 + "]" * 199 + "}")) is None
    assert reason(raw(event_data='{"a":' + "[" * 200 + "]" * 200 + "}")) == "invalid_json"


def test_event_time_window() -> None:
    assert reason(payload(ts=NOW + 23 * HOUR)) is None
    assert reason(payload(ts=NOW + 25 * HOUR)) == "ts_in_future"
    assert reason(payload(ts=946_684_800_000)) is None
    with pytest.raises(ContractViolation, match="ts_in_future"):
        decode_telemetry(payload(ts=NOW + 2 * HOUR), now_ms=NOW, max_future_skew_ms=HOUR)
    with pytest.raises(ContractViolation, match="too_large"):
        decode_telemetry(payload(), now_ms=NOW, max_bytes=50)


def _patterned_fields() -> list[tuple[str, bool]]:
    """(field, whether the pattern is on its keys) for every string pattern of Telemetry."""
    out = []
    for field in msgspec.inspect.type_info(Telemetry).fields:
        kind = field.type
        kinds = kind.types if isinstance(kind, msgspec.inspect.UnionType) else (kind,)
        for each in kinds:
            if isinstance(each, msgspec.inspect.StrType) and each.pattern:
                out.append((field.name, False))
            if isinstance(each, msgspec.inspect.DictType) and getattr(each.key_type, "pattern", None):
                out.append((field.name, True))
    return out


def test_every_name_pattern_is_checked_also_for_names_seen_before() -> None:
    fields = _patterned_fields()
    assert {f for f, _ in fields} == {"device_id", "device_type", "site", "event", "metrics"}
    for name, of_keys in fields:
        good = {"metrics": {"t": 1.0}} if of_keys else {name: "known-1"}
        bad = {"metrics": {"t": 1.0, "not ok": 1.0}} if of_keys else {name: "not ok"}
        assert reason(payload(**good)) is None
        assert reason(payload(**bad)) == "invalid_field", name
        assert reason(payload(**good)) is None


# --- the bulk decoder ------------------------------------------------------------------


def _corpus() -> tuple[list[bytes | None], list[bytes | None]]:
    config = SimConfig(seed=7, homes=6, vehicles=2, start_ms=START_MS, fault_rate=30.0, anomaly_rate=30.0)
    valid = [p.encode() if isinstance(p, str) else p for _, _, p, g in generate(config, 40) if g != STATUS]
    thermostat = generate(SimConfig(seed=1, homes=1, vehicles=0, start_ms=START_MS, mix={"thermostat": 1}), 2)
    malformed = [corrupt(thermostat[0][2], variant) for variant in MALFORMED_VARIANTS]
    invalid = list(INVALID.values()) + [m.encode() if isinstance(m, str) else m for m in malformed]
    invalid += [
        payload(seq=2**63),
        payload(device_type="a:b"),
        payload(metrics={"a b": 1.0}),
        raw(event_data='{"a":' + "[" * 100_000 + "]" * 100_000 + "}"),
        payload().replace(b'"seq":41', b'"seq":"x","seq":42'),
    ]
    rng = random.Random(5)
    values: list[bytes | None] = valid + invalid + [None, None]
    rng.shuffle(values)
    keys: list[bytes | None] = []
    for value in values:
        try:
            device = json.loads(value or b"")["device_id"].encode()
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            device = b"anything"
        keys.append(rng.choice([device, device, device, None, b"", b"someone-else", device + b"\xff"]))
    return values, keys


def _expected(value: bytes | None, key: bytes | None) -> tuple[Telemetry | None, ContractViolation | None]:
    try:
        message = decode_telemetry(value or b"", now_ms=NOW)
    except ContractViolation as exc:
        return None, exc
    if key and key.decode(errors="replace") != message.device_id:
        key_text = key.decode(errors="replace")
        return None, ContractViolation("key_mismatch", f"Kafka key {key_text!r} != device_id {message.device_id!r}")
    return message, None


def test_decode_batch_agrees_with_decode_telemetry_record_by_record() -> None:
    values, keys = _corpus()
    batch = decode_batch(values, keys, now_ms=NOW)
    assert isinstance(batch, DecodedBatch) and len(batch) == len(values)
    assert batch.seq.dtype == batch.ts.dtype == batch.metric_row.dtype == np.int64
    assert batch.metric_value.dtype == np.float64
    for column in (
        batch.reason,
        batch.detail,
        batch.device_id,
        batch.device_type,
        batch.site,
        batch.event,
        batch.metric_name,
    ):
        assert column.dtype == object and column.ndim == 1
    reasons = set()
    at = 0
    for i, (value, key) in enumerate(zip(values, keys, strict=True)):
        message, violation = _expected(value, key)
        if violation is not None:
            reasons.add(violation.reason)
            assert (batch.reason[i], batch.detail[i]) == (violation.reason, violation.detail), i
            assert batch.device_id[i] is batch.device_type[i] is batch.site[i] is batch.event[i] is None
            assert batch.seq[i] == batch.ts[i] == 0 and not batch.valid[i]
            continue
        assert message is not None and batch.valid[i] and batch.reason[i] is None and batch.detail[i] is None
        assert (batch.device_id[i], batch.device_type[i], batch.site[i], batch.event[i], batch.seq[i], batch.ts[i]) == (
            message.device_id,
            message.device_type,
            message.site,
            message.event,
            message.seq,
            message.ts,
        )
        count = len(message.metrics)
        assert list(batch.metric_row[at : at + count]) == [i] * count
        assert (
            dict(zip(batch.metric_name[at : at + count], batch.metric_value[at : at + count], strict=True))
            == message.metrics
        )
        assert list(batch.metric_name[at : at + count]) == list(message.metrics)  # the message's key order
        at += count
    assert at == len(batch.metric_row) == len(batch.metric_name) == len(batch.metric_value)
    assert reasons >= set(INVALID) | {"key_mismatch"}
    assert batch.valid.sum() > len(values) / 2


def test_decode_batch_checks_a_batch_as_it_checks_each_record_alone() -> None:
    """The bulk checks (names, version, event time, key, metrics, on columns) refuse exactly
    what a batch of the one record refuses, whatever else the batch holds."""
    from iotwatch.contract.metric_catalog import KNOWN_METRICS

    values: list[bytes | None] = [payload(device_id=f"bulk-{i}", seq=i) for i in range(40)]
    keys: list[bytes | None] = [f"bulk-{i}".encode() for i in range(40)]
    values[3] = payload(device_id="bulk 3")  # a name against the pattern, never seen
    values[7], values[11] = payload(device_id="bulk-7", ts=1), payload(device_id="bulk-11", v=2)
    values[13] = payload(device_id="bulk-13", metrics={"co2_ppm": 1.0})  # not a thermostat's
    values[17], values[23] = b'{"v":1', None
    keys[19], keys[29] = b"bulk-0", b""  # a mismatch; an empty key is not checked
    values[31] = payload(device_id="bulk-31", ts=2**70)  # beyond int64
    batch = decode_batch(values, keys, now_ms=NOW, metrics_of=KNOWN_METRICS)
    alone = [decode_batch([v], [k], now_ms=NOW, metrics_of=KNOWN_METRICS) for v, k in zip(values, keys, strict=True)]
    for name in ("reason", "detail", "device_id", "device_type", "site", "event", "seq", "ts"):
        assert list(getattr(batch, name)) == [getattr(one, name)[0] for one in alone], name
    assert list(batch.metric_name) == [m for one in alone for m in one.metric_name]
    assert list(batch.metric_value) == [m for one in alone for m in one.metric_value]
    refused = {3: "invalid_field", 7: "ts_too_old", 11: "unsupported_version", 13: "unknown_metric"}
    refused |= {17: "invalid_json", 19: "key_mismatch", 23: "invalid_json", 31: "ts_in_future"}
    assert {i: r for i, r in enumerate(batch.reason) if r is not None} == refused


def test_decode_batch_small_cases() -> None:
    empty = decode_batch([], now_ms=NOW)
    assert len(empty) == 0 and empty.metric_value.shape == (0,) and empty.seq.dtype == np.int64
    batch = decode_batch(
        [None, payload(), payload(device_id="other")], [b"x", b"home-003-thermostat-0", b"k\xff"], now_ms=NOW
    )
    assert list(batch.reason) == ["invalid_json", None, "key_mismatch"]
    assert batch.detail[2] == "Kafka key 'k\ufffd' != device_id 'other'"
    assert list(batch.valid) == [False, True, False]
    assert list(batch.metric_row) == [1, 1] and list(batch.metric_name) == ["temperature_c", "humidity_pct"]
    assert list(batch.metric_value) == [21.4, 43.0] and list(batch.seq) == [0, 41, 0]
    unkeyed = decode_batch([payload(device_id="other")], now_ms=NOW)
    assert list(unkeyed.reason) == [None] and list(unkeyed.device_id) == ["other"]
    assert decode_batch([payload()], [b""], now_ms=NOW).reason[0] is None  # an empty key is not checked
    with pytest.raises(ValueError):
        decode_batch([payload()], [], now_ms=NOW)


# --- device commands and the on-call records ---------------------------------------------


def test_commands_and_replies_round_trip_and_bad_ones_name_the_reason() -> None:
    from iotwatch.contract.device_commands import (
        Command,
        CommandReply,
        CommandStatus,
        decode_command,
        decode_command_reply,
        encode,
    )
    from iotwatch.contract.device_topics import parse_command_ack_topic

    command = Command(1, "c1", "home-1-thermostat-0", "reset_hvac", 1_000, 61_000, "responder", {"hard": True}, "a1")
    assert decode_command(encode(command)) == command and command.expired(61_000) and not command.expired(60_999)
    reply = CommandReply(1, "c1", "home-1-thermostat-0", CommandStatus.REJECTED, 2_000, "expired")
    assert decode_command_reply(encode(reply)) == reply
    body = json.loads(encode(command))
    cases = {
        b"{nope": "invalid_json",
        json.dumps({**body, "v": 2}).encode(): "unsupported_version",
        json.dumps({**body, "extra": 1}).encode(): "invalid_field",
        json.dumps({k: v for k, v in body.items() if k != "expires_at_ms"}).encode(): "invalid_field",
        json.dumps({**body, "device_id": "a/b"}).encode(): "invalid_field",
    }
    for raw, reason in cases.items():
        with pytest.raises(ContractViolation) as caught:
            decode_command(raw)
        assert caught.value.reason == reason, raw
    with pytest.raises(ContractViolation, match="invalid_field"):
        decode_command_reply(json.dumps({**json.loads(encode(reply)), "status": "maybe"}).encode())
    assert parse_command_ack_topic("iot/h/thermostat/d/commands/ack") == ("h", "thermostat", "d")
    with pytest.raises(ContractViolation, match="bad_topic"):
        parse_command_ack_topic("iot/h/thermostat/d/commands")


def test_oncall_records_decode_strictly() -> None:
    from iotwatch.contract.oncall import AlertState, AlertStep, BadRecord, Matchers, Silence, decode, encode

    ack = AlertState(1, "a1", AlertStep.ACKNOWLEDGED, "alice", 5, "on it")
    assert decode(encode(ack), AlertState) == ack
    silence = Silence(1, "s1", Matchers(site="home-1"), 0, 10, "carol")
    assert decode(encode(silence), Silence).silences(_alert(site="home-1", rule="x"), 5)
    assert not silence.silences(_alert(site="home-2"), 5) and not silence.silences(_alert(site="home-1"), 10)
    for raw in (None, b"[]", encode(ack).replace(b'"v":1', b'"v":9'), encode(ack)[:-1] + b',"x":1}'):
        with pytest.raises(BadRecord):
            decode(raw, AlertState)


def _alert(**fields: Any) -> AlertRecord:
    base: dict[str, Any] = {
        "alert_id": "a1",
        "state": "raised",
        "severity": "major",
        "rule": "stuck_hvac",
        "detector": "rule",
        "device_id": "home-1-thermostat-0",
        "device_type": "thermostat",
        "site": "home-1",
        "score": 0.9,
        "first_event_ms": 1_763_784_000_000,
        "detected_at_ms": 1_763_784_001_000,
        "message": "m",
    }
    return AlertRecord(**{**base, **fields})


def test_alert_records_round_trip_and_fill_their_times() -> None:
    record = _alert(contributors=[Contributor("temperature_c", 31.5, 0.91)], last_event_ms=1_763_784_000_500)
    assert decode_alert(encode_alert(record)) == record
    assert record.v == ALERT_SCHEMA_VERSION and record.first_event_time == "2025-11-22T04:00:00.000Z"
    assert record.last_event_time == "2025-11-22T04:00:00.500Z" and record.detected_at == "2025-11-22T04:00:01.000Z"
    wire = json.loads(encode_alert(record))
    assert wire["metric"] is None and wire["contributors"] == [
        {"metric": "temperature_c", "value": 31.5, "score": 0.91}
    ]
    assert alert_as_dict(record) == wire


def test_alert_records_decode_old_and_newer_producers() -> None:
    body = json.loads(encode_alert(_alert()))
    del body["v"], body["first_event_time"]  # written before those fields existed
    assert decode_alert(json.dumps(body).encode()) == _alert()
    assert decode_alert(json.dumps({**body, "added_later": 1}).encode()) == _alert()


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (None, "empty value"),
        (b"{not json", "not JSON"),
        (b"[]", "not an alert record"),
        (b'{"alert_id": "a1", "state": "raised"}', "missing required field"),
        (json.dumps({**json.loads(encode_alert(_alert())), "state": "acknowledged"}).encode(), "`$.state`"),
        (json.dumps({**json.loads(encode_alert(_alert())), "score": "high"}).encode(), "`$.score`"),
        (json.dumps({**json.loads(encode_alert(_alert())), "alert_id": ""}).encode(), "alert_id is empty"),
        (json.dumps({**json.loads(encode_alert(_alert())), "v": 2}).encode(), "v=2"),
    ],
)
def test_alert_records_that_are_not_alerts_say_why(raw: bytes | None, says: str) -> None:
    with pytest.raises(BadAlert, match=re.escape(says)):
        decode_alert(raw)


def test_both_alert_producers_write_the_contract_record() -> None:
    """The job's lifecycle and the responder's escalation both build the contract's record."""
    from iotwatch.contract.oncall import CommandAudit, CommandOutcome
    from iotwatch.responder.escalation import RULE, escalation_record
    from iotwatch.streaming.alerting import AlertContext, DeviceIdentity, Episode, Observation, RuleSpec, advance

    spec = RuleSpec("stuck_hvac", Severity.MAJOR, fire=0.5, clear=0.2)
    context = AlertContext(DeviceIdentity("home-1-thermostat-0", "thermostat", "home-1"), now_ms=lambda: 7)
    hot = Observation(1.0, "temperature_c", 31.0, 30.0, "hot")
    raised = advance(Episode(), spec, hot.score, 1_000, 4, context, lambda: hot)
    assert isinstance(raised, AlertRecord) and decode_alert(encode_alert(raised)) == raised
    audit = CommandAudit(
        1, "c1", "p", raised.alert_id, raised.rule, raised.device_id, raised.device_type, raised.site,
        "reset_hvac", "responder", 1, 2, 3, CommandOutcome.ESCALATED,
    )  # fmt: skip
    escalation = escalation_record(raised, audit, AlertLifecycle.RAISED, "timed out", 9, "https://runbook")
    assert decode_alert(encode_alert(escalation)) == escalation
    assert (escalation.rule, escalation.caused_by, escalation.first_event_ms) == (RULE, raised.alert_id, 1_000)


def test_one_spelling_per_rule_and_anomaly_kind() -> None:
    """Every rule the job can raise (its per-device rules and the driver's ``ingestion_gap``)
    and the responder's escalation are contract rules; the
    simulators inject exactly the contract's anomaly kinds, each judged by the one table;
    the earlier spellings of two kinds still resolve, to the one spelling."""
    from iotwatch.contract.detection import RULES_FOR_ANOMALY_KIND, AnomalyKind, Rule
    from iotwatch.devices.anomaly_kinds import ANOMALY, KINDS, resolve_kind
    from iotwatch.responder.escalation import RULE
    from iotwatch.settings import StreamSettings
    from iotwatch.streaming.rules import rule_specs

    assert {*rule_specs(StreamSettings(), "ensemble"), RULE, Rule.INGESTION_GAP} == {rule.value for rule in Rule}
    injected = {name for name, kind in KINDS.items() if kind.category == ANOMALY}
    assert injected == {kind.value for kind in AnomalyKind} == set(RULES_FOR_ANOMALY_KIND)
    assert all(rules <= {rule.value for rule in Rule} for rules in RULES_FOR_ANOMALY_KIND.values())
    assert (resolve_kind("hvac_stuck").name, resolve_kind("leak").name) == ("stuck_hvac", "water_leak")


def test_dead_letters_read_back_as_written() -> None:
    from iotwatch.contract.dead_letters import H_VERSION, DeadLetter

    letter = DeadLetter("invalid_json", "line 1", "gateway", b"{oops", b"dev-1", "iot/s/t/d/telemetry")
    assert DeadLetter.of_message(letter.original, letter.key, letter.headers()) == letter
    older = [(k, v) for k, v in letter.headers() if k != H_VERSION]  # written before the version header
    assert DeadLetter.of_message(letter.original, letter.key, older) == letter
    with pytest.raises(ValueError, match="v=2"):
        DeadLetter.of_message(b"", None, [(H_VERSION, b"2"), *older])
    with pytest.raises(ValueError, match="no iotwatch.reason"):
        DeadLetter.of_message(b"x", None, [])


def test_a_metric_its_device_type_does_not_have_is_unknown_metric_for_one_reading_and_a_batch() -> None:
    from iotwatch.contract.metric_catalog import KNOWN_METRICS

    def payload(device_type: str, metrics: dict[str, float]) -> bytes:
        body = {"v": 1, "device_id": "d-1", "device_type": device_type, "site": "s", "seq": 0}
        return json.dumps({**body, "ts": 1763784000000, "metrics": metrics}).encode()

    foreign = payload("thermostat", {"temperature_c": 21.0, "power_w": 800.0, "coolant_temp_c": 90.0})
    with pytest.raises(ContractViolation) as caught:
        decode_telemetry(foreign, metrics_of=KNOWN_METRICS)
    assert caught.value.reason == "unknown_metric"
    assert "a thermostat has no coolant_temp_c, power_w" in caught.value.detail
    assert decode_telemetry(foreign).metrics["power_w"] == 800.0  # without the catalogue: not judged
    accepted = [
        payload("thermostat", {"temperature_c": 21.0, "setpoint_c": 20.0}),
        payload("thermostat", {"temperature_f": 70.0}),  # a unit alias of one of its metrics
        payload("pump", {"flow_lpm": 3.0}),  # a type the catalogue does not list: not judged
    ]
    for raw in accepted:
        decode_telemetry(raw, metrics_of=KNOWN_METRICS)
    batch = decode_batch([foreign, *accepted], metrics_of=KNOWN_METRICS)
    assert list(batch.reason) == ["unknown_metric", None, None, None]
    assert list(batch.metric_row) == [1, 1, 2, 3]  # the refused record contributes no metric
