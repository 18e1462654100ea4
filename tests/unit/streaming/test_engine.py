"""The per-partition engine without Spark: dedup, lateness, scoring, alert lifecycle, aggregates."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pytest

from iotwatch.contract.alerts import AlertRecord, Severity, decode_alert
from iotwatch.contract.metric_catalog import DEVICE_METRICS
from iotwatch.contract.telemetry import GOODBYE_EVENT, Telemetry
from iotwatch.settings import StreamSettings
from iotwatch.streaming.alerting import AlertContext, DeviceIdentity, Episode, Observation, RuleSpec, advance, alert_id
from iotwatch.streaming.cleaning import clean_entries
from iotwatch.streaming.device_state import CORE_FIELDS
from iotwatch.streaming.device_table import DeviceTable
from iotwatch.streaming.engine import PartitionEngine
from iotwatch.streaming.partition_io import BatchOutput, RecordColumns
from iotwatch.streaming.state_store import MemoryStore

T0 = 1_763_784_000_000


@dataclass(frozen=True)
class Rec:
    key: str | None
    value: bytes | None
    offset: int
    append_ms: int = 0


def record(
    seq: int,
    *,
    device: str = "th-1",
    ts: int | None = None,
    offset: int | None = None,
    temperature: float | None = None,  # temperature_c; by default 21.0 where the type has one
    device_type: str = "thermostat",
    append_ms: int = 0,
    site: str = "h1",
    **metrics: float,
) -> Rec:
    message = Telemetry(
        v=1,
        device_id=device,
        device_type=device_type,
        site=site,
        seq=seq,
        ts=T0 + seq * 1000 if ts is None else ts,
        metrics={**_temperature(device_type, temperature), **metrics},
    )
    return Rec(device, message.to_json(), seq if offset is None else offset, append_ms)


def _temperature(device_type: str, value: float | None) -> dict[str, float]:
    """The ``temperature_c`` a test record carries: none for a type that has no such metric
    (the contract refuses it there as ``unknown_metric``) unless the test gives one."""
    if value is not None:
        return {"temperature_c": value}
    return {"temperature_c": 21.0} if "temperature_c" in DEVICE_METRICS.get(device_type, {"temperature_c": ()}) else {}


def noisy_series(n: int, spike_at: int | None = None, seed: int = 1) -> list[Rec]:
    rng = random.Random(seed)
    return [record(i, temperature=21 + rng.gauss(0, 0.2) + (8.0 if i == spike_at else 0.0)) for i in range(n)]


class Harness:
    """An engine with an in-memory store: what one partition of the job does, batch by batch."""

    def __init__(self, settings: StreamSettings | None = None, **kwargs: Any) -> None:
        self.engine = PartitionEngine(settings or StreamSettings(), **kwargs)
        self.store = MemoryStore(self.engine.state_sizes, self.engine.seq_words)

    def process(self, records: list[Rec], now_ms: int = 0) -> list[dict[str, Any]]:
        return self.output(records, now_ms).rows()

    def output(self, records: list[Rec], now_ms: int = 0, event_clock_ms: int = 0) -> BatchOutput:
        columns = RecordColumns.from_payloads(
            0,
            [r.value for r in records],
            [r.key for r in records],
            [r.offset for r in records],
            [r.append_ms for r in records],
            now_ms=T0 + 10**9,
        )
        return self.engine.process(self.store, columns, now_ms, event_clock_ms)

    def run(self, batches: list[list[Rec]]) -> list[dict[str, Any]]:
        return [row for batch in batches for row in self.process(batch)]

    def silence(self, device: str, now_ms: int) -> list[dict[str, Any]]:
        return self.engine.silence(self.store, [device], now_ms).rows()

    def state(self, device: str = "th-1") -> DeviceTable:
        state = self.store.load(device)
        assert state is not None
        return state

    def counters(self, device: str = "th-1") -> dict[str, int]:
        return self.state(device).counters()


def alerts_of(rows: list[dict[str, Any]]) -> list[AlertRecord]:
    return [decode_alert(r["body"].encode()) for r in rows if r["kind"] == "alert"]


def readings_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["kind"] == "reading"]


def test_spike_raises_one_alert_then_clears_and_clean_data_stays_quiet() -> None:
    assert alerts_of(Harness().run([noisy_series(400, seed=2)])) == []
    alerts = alerts_of(Harness().run([noisy_series(400, spike_at=300)]))
    assert [(a.state, a.rule) for a in alerts] == [("raised", "anomaly_score"), ("cleared", "anomaly_score")]
    raised = alerts[0]
    assert raised.first_event_ms == T0 + 300 * 1000 and raised.metric == "temperature_c"
    assert raised.alert_id == alert_id("th-1", "anomaly_score", T0 + 300 * 1000) == alerts[1].alert_id
    assert raised.contributors[0].metric == "temperature_c"


def _comparable(rows: list[dict[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for row in rows:
        kind = row["kind"]
        if kind == "reading":
            out.append(
                (kind, row["device_id"], row["seq"], sorted(row["metrics"].items()), sorted(row["scores"].items()))
            )
        elif kind == "alert":
            body = json.loads(row["body"])
            body.pop("detected_at"), body.pop("detected_at_ms")
            out.append((kind, json.dumps(body, sort_keys=True)))
        elif kind == "aggregate":  # sums of a bucket split over batches may differ in the last bit
            out.append(
                (
                    kind,
                    row["device_id"],
                    row["metric"],
                    row["event_ms"],
                    row["count"],
                    round(row["sum"], 9),
                    row["min"],
                    row["max"],
                    row["last"],
                    row["max_score"],
                )
            )
    return sorted(out, key=repr)


def test_results_do_not_depend_on_how_the_stream_is_cut_into_batches() -> None:
    """Same scores, alerts (ids and contents) and aggregates whatever the micro-batch sizes,
    over several interleaved devices."""
    rng = random.Random(3)
    series = []
    for i in range(600):
        for d in range(3):
            spike = 9.0 if (i, d) in ((300, 0), (420, 1), (500, 2)) else 0.0
            series.append(
                record(
                    i,
                    device=f"th-{d}",
                    offset=len(series),
                    temperature=21 + rng.gauss(0, 0.2) + spike,
                    humidity_pct=40 + rng.gauss(0, 1),
                )
            )
    whole = Harness().run([series])
    cuts = [0, 1, 97, 98, 700, 1303, 1304, len(series)]
    cut = Harness().run([series[a:b] for a, b in zip(cuts, cuts[1:], strict=False)])
    assert _comparable(whole) == _comparable(cut)
    ids = sorted(a.alert_id for a in alerts_of(whole) if a.state == "raised")
    assert len(ids) == 3


def test_a_device_that_reboots_and_restarts_at_seq_0_is_scored_not_deduplicated() -> None:
    """100 readings, a reboot (seq back to 0, time going on), 50 more: all 150 scored and
    archived, one seq reset; a copy of a reading (same seq and time) is still a duplicate."""
    harness = Harness()
    before = [record(i) for i in range(100)]
    after = [record(i, ts=T0 + (100 + i) * 1000, offset=100 + i) for i in range(50)]
    copies = [record(10, ts=T0 + 110 * 1000, offset=150), record(12, ts=T0 + 112 * 1000, offset=151)]  # re-sent
    rows = harness.run([before, after[:20], after[20:] + copies])
    assert len(readings_of(rows)) == 150
    assert harness.counters()["seq_resets"] == 1 and harness.counters()["duplicates"] == 2
    assert sorted(r["seq"] for r in readings_of(rows)) == sorted(list(range(100)) + list(range(50)))


def test_a_device_id_seen_under_another_site_or_type_is_dead_lettered_not_merged() -> None:
    harness = Harness()
    rows = harness.process([record(i) for i in range(20)])
    assert len(readings_of(rows)) == 20
    intruder = [record(i, site="h2", offset=20 + i) for i in range(5)]
    intruder += [record(30 + i, device_type="leak_sensor", offset=40 + i) for i in range(3)]
    rows = harness.process(intruder + [record(20, offset=99)])
    dead = [r for r in rows if r["kind"] == "dlq"]
    assert [r["reason"] for r in dead] == ["identity_conflict"] * 8
    assert "thermostat at site h1" in dead[0]["detail"] and "site h2" in dead[0]["detail"]
    assert [r["seq"] for r in readings_of(rows)] == [20]  # the real device goes on
    assert harness.state().site[0] == "h1" and harness.counters()["dead_lettered"] == 8


def test_a_reading_out_of_order_within_the_lateness_is_archived_but_raises_no_false_alarm() -> None:
    """A metric drifting steadily; one reading held back behind 30 newer ones (within the
    allowed lateness) would look like a sudden drop if fed to the detector now. It is
    archived, not scored and not learnt from, and raises nothing; in order, it is quiet."""
    rng = random.Random(5)
    values = [21 + i * 0.05 + rng.gauss(0, 0.02) for i in range(300)]
    arrival = list(range(200)) + list(range(201, 231)) + [200] + list(range(231, 300))
    series = [record(i, temperature=values[i]) for i in range(300)]
    held = [record(seq, temperature=values[seq], offset=position) for position, seq in enumerate(arrival)]
    for order in (series, held):
        harness = Harness()
        rows = harness.run([order[:150], order[150:]])
        assert alerts_of(rows) == [], alerts_of(rows)
        assert len(readings_of(rows)) == 300
    late = next(r for r in readings_of(rows) if r["seq"] == 200)
    assert late["scores"] == {} and late["metrics"]["temperature_c"] == values[200]
    assert Harness().engine.detector_name and harness.counters()["late"] == 0


def test_duplicates_are_counted_not_scored_and_late_records_are_routed() -> None:
    harness = Harness()
    records = [record(i) for i in range(300) if i != 3]
    records += [record(4, offset=300), record(9, offset=301)]  # re-sent
    records.append(record(3, offset=302))  # arrives after seq 299: 296 s older than the newest
    rows = harness.process(records)
    assert sum(r["kind"] == "late" for r in rows) == 1
    assert {r["seq"] for r in readings_of(rows)} == set(range(300)) - {3}
    late = next(r for r in rows if r["kind"] == "late")
    assert late["reason"] == "late" and late["raw"] == records[-1].value
    counters = harness.counters()
    assert (counters["received"], counters["scored"], counters["duplicates"], counters["late"]) == (302, 299, 2, 1)
    tally = json.loads(next(r for r in rows if r["kind"] == "tally")["body"])
    assert (tally["received"], tally["scored"], tally["duplicates"], tally["late"]) == (302, 299, 2, 1)


def test_a_clock_stepping_back_is_not_lateness() -> None:
    """Readings that come in seq order but stamped 200 s back (the device's clock was
    reset) are scored, counted as clock steps, and do not overwrite emitted aggregates."""
    harness = Harness()
    before = harness.process([record(i) for i in range(300)])
    stepped = [record(300 + i, ts=T0 + (300 + i) * 1000 - 200_000) for i in range(60)]  # into emitted minutes
    after = harness.process(stepped)
    assert {r["seq"] for r in readings_of(after)} == set(range(300, 360))
    assert not [r for r in after if r["kind"] == "late"]
    counters = harness.counters()
    assert (counters["clock_steps"], counters["late"], counters["scored"]) == (60, 0, 360)
    emitted = {(r["event_ms"], r["metric"]) for r in before if r["kind"] == "aggregate"}
    assert emitted and not emitted & {(r["event_ms"], r["metric"]) for r in after if r["kind"] == "aggregate"}


def test_out_of_order_within_lateness_is_scored() -> None:
    rows = Harness().process([record(1, offset=0), record(0, offset=1)])
    assert sorted(r["seq"] for r in readings_of(rows)) == [0, 1]


def test_malformed_and_mismatched_records_go_to_dead_letters() -> None:
    harness = Harness()
    bad = [
        Rec("th-1", b"{nope", 0),
        Rec("th-1", None, 1),
        Rec("th-1", record(0, device="other").value, 2),
        Rec(None, b"[]", 3),
    ]
    rows = [r for r in harness.process(bad) if r["kind"] != "tally"]
    reasons = [r["reason"] for r in rows]
    assert sorted(reasons) == sorted(["invalid_json", "invalid_json", "key_mismatch", "not_an_object"])
    assert all(r["kind"] == "dlq" for r in rows)
    assert sorted(str(r["device_id"]) for r in rows) == ["None", "th-1", "th-1", "th-1"]
    assert harness.counters()["dead_lettered"] == 3


def test_seq_window_detects_duplicates_and_counter_resets() -> None:
    harness = Harness(StreamSettings(dedup_window=64))
    seqs = [0, 1, 3, 2, 3, 1, 500, 400]  # copies carry their original's time; 400 is newer than 500
    times = [0, 1, 3, 2, 3, 1, 500, 501]
    rows = harness.process(
        [record(s, offset=i, ts=T0 + t * 1000) for i, (s, t) in enumerate(zip(seqs, times, strict=True))]
    )
    assert [r["seq"] for r in readings_of(rows)] == [0, 1, 3, 2, 500, 400]
    counters = harness.counters()
    assert (counters["duplicates"], counters["seq_resets"]) == (2, 1)


def test_anti_flap_hold_and_clear_threshold() -> None:
    spec = RuleSpec("r", Severity.MAJOR, fire=0.8, clear=0.4, hold=2, clear_hold=2)
    ctx = AlertContext(DeviceIdentity("d", "thermostat", "h"), now_ms=lambda: 0)
    episode = Episode()
    scores = [0.9, 0.3, 0.9, 0.9, 0.5, 0.85, 0.6, 0.3, 0.9, 0.3, 0.2]
    events = [
        advance(episode, spec, s, i, i, ctx, lambda s=s: Observation(s, "m", s, 0.8, "x")) for i, s in enumerate(scores)
    ]
    states = [(i, e.state, e.occurrences) for i, e in enumerate(events) if e]
    # one blip does not fire; two in a row do; hovering between clear and fire keeps it open
    # (and counts repeats); two readings below clear close it.
    assert states == [(3, "raised", 2), (10, "cleared", 4)]
    assert events[3].alert_id == alert_id("d", "r", 2)


def test_rules_fire_for_crash_harsh_braking_leak_stuck_hvac_and_out_of_range() -> None:
    crash = [record(0, device="car", device_type="vehicle_edr", speed_kmh=50.0, accel_x_g=-7.0)]
    harsh = [record(0, device="van", device_type="vehicle_edr", speed_kmh=40.0, accel_x_g=-0.8)]
    leak = [record(0, device="leak", device_type="leak_sensor", water_detected=1.0)]
    hvac = [  # heating (cold outside) 9 C past the setpoint
        record(i, device="th", temperature=30.0, setpoint_c=21.0, hvac_on=1.0, outside_temperature_c=5.0)
        for i in range(150)
    ]
    odd = [record(0, device="x", temperature=999.0)]
    raised = {}
    for batch in (crash, harsh, leak, hvac, odd):
        for alert in alerts_of(Harness().process(batch)):
            raised[alert.rule] = alert
    assert set(raised) == {"crash", "harsh_braking", "water_leak", "stuck_hvac", "out_of_range"}
    assert raised["crash"].severity == "critical" and raised["out_of_range"].value == 999.0
    assert raised["harsh_braking"].severity == "warning" and raised["harsh_braking"].device_id == "van"
    assert raised["stuck_hvac"].occurrences == 121  # held for the configured 120 s (readings every 1 s)
    # each rule's alerts carry the runbook link of the rules' configuration
    assert all(
        a.runbook_url == StreamSettings().runbook_url(rule) and rule in a.runbook_url for rule, a in raised.items()
    )
    assert StreamSettings(runbook_urls={"crash": "https://wiki/crash"}).runbook_url("crash") == "https://wiki/crash"


def test_silence_raises_device_silent_and_data_clears_it() -> None:
    harness = Harness()
    harness.process([record(i) for i in range(5)], now_ms=1_000)
    silent = alerts_of(harness.silence("th-1", now_ms=120_000))
    assert [(a.rule, a.state) for a in silent] == [("device_silent", "raised")]
    back = alerts_of(harness.process([record(5)], now_ms=130_000))
    assert [(a.rule, a.state, a.alert_id) for a in back] == [("device_silent", "cleared", silent[0].alert_id)]


def test_a_gap_in_the_log_raises_device_silent_once_even_inside_one_batch() -> None:
    """A job catching up on a backlog sees the silence in the records' Kafka timestamps and
    event times, while a peer kept reporting, with the alert id the processing-time timer
    gives; a gap the timer already reported is not raised twice."""
    timeout_ms = int(StreamSettings().silence_timeout_s * 1000)
    resumed_s = 4 + timeout_ms // 1000 + 5

    def stamped(seq: int, second: int, device: str = "th-1") -> Rec:
        return record(seq, device=device, ts=T0 + second * 1000, append_ms=T0 + second * 1000, offset=second * 10)

    before = [stamped(i, i) for i in range(5)]
    after = [stamped(5 + i, resumed_s + i) for i in range(3)]
    peer = [stamped(i, i, "th-2") for i in range(resumed_s + 3)]  # kept arriving meanwhile
    resumed = T0 + resumed_s * 1000

    in_one_batch = alerts_of(Harness().process(before + after + peer, now_ms=resumed + 3000))
    assert [(a.device_id, a.rule, a.state) for a in in_one_batch] == [
        ("th-1", "device_silent", "raised"),
        ("th-1", "device_silent", "cleared"),
    ]
    assert in_one_batch[0].first_event_ms == T0 + 4000 and "in the log" in in_one_batch[0].message

    timed = Harness()
    timed.process(before, now_ms=T0 + 4000)
    by_timer = alerts_of(timed.silence("th-1", now_ms=T0 + 4000 + timeout_ms))
    back = alerts_of(timed.process(after, now_ms=resumed + 3000))
    assert [(a.state, a.alert_id) for a in by_timer + back] == [
        ("raised", in_one_batch[0].alert_id),
        ("cleared", in_one_batch[0].alert_id),
    ]

    steady = [record(i, append_ms=T0 + i * 1000) for i in range(50)]  # closer together than the timeout
    assert alerts_of(Harness().process(steady)) == []


def test_the_backlog_after_an_outage_is_no_silence_but_a_device_left_behind_is() -> None:
    """Kafka was down for twice the silence timeout while the devices kept publishing: their
    records reach the log after the outage (a gap in append time) with the event times of the
    outage. No device is silent -- unless its own event times jumped while its peers' did not,
    or the partition's earlier batches carried the peers past it (``event_clock_ms``)."""
    timeout_s = int(StreamSettings().silence_timeout_s)
    down, up = 10, 10 + 2 * timeout_s  # seconds after T0

    def device(name: str, seconds: range, appended: int | None = None) -> list[Rec]:
        return [
            record(
                s,
                device=name,
                ts=T0 + s * 1000,
                append_ms=T0 + (s if appended is None or s < down else appended) * 1000,
            )
            for s in seconds
        ]

    fleet = [device(f"th-{n}", range(0, up + 5), appended=up) for n in range(3)]
    assert alerts_of(Harness().process([r for recs in fleet for r in recs], now_ms=T0 + (up + 6) * 1000)) == []

    # th-9 stopped at the outage and came back after it: its event times jumped, its peers' did not
    stopped = device("th-9", range(0, down + 1)) + [
        record(s, device="th-9", ts=T0 + s * 1000, append_ms=T0 + (up + 5) * 1000) for s in range(up + 4, up + 6)
    ]
    rows = Harness().process([r for recs in fleet for r in recs] + stopped, now_ms=T0 + (up + 6) * 1000)
    assert [(a.device_id, a.state) for a in alerts_of(rows)] == [("th-9", "raised"), ("th-9", "cleared")]

    # the peers went past the device in earlier batches: the partition's event clock says so
    alone = Harness()
    alone.process(device("th-9", range(0, 5)), now_ms=T0 + 5000)
    later = device("th-9", range(5 + timeout_s + 5, 5 + timeout_s + 8))
    assert alerts_of(alone.output(later, now_ms=T0 + 80_000).rows()) == []  # nobody else: a gap of the input
    clocked = Harness()
    clocked.process(device("th-9", range(0, 5)), now_ms=T0 + 5000)
    out = clocked.output(later, now_ms=T0 + 80_000, event_clock_ms=T0 + (5 + timeout_s + 2) * 1000)
    assert [(a.device_id, a.state) for a in alerts_of(out.rows())] == [("th-9", "raised"), ("th-9", "cleared")]


def test_a_device_whose_last_record_is_a_goodbye_is_named_and_one_heard_after_it_is_not() -> None:
    bye = Telemetry(
        v=1,
        device_id="th-1",
        device_type="thermostat",
        site="h1",
        seq=5,
        ts=T0 + 5000,
        metrics={"temperature_c": 21.0},
        event=GOODBYE_EVENT,
    )
    goodbye = Rec("th-1", bye.to_json(), 5)
    harness = Harness()
    out = harness.output([*(record(i) for i in range(5)), goodbye, record(0, device="th-2")], now_ms=T0)
    assert out.goodbyes == ["th-1"] and alerts_of(out.rows()) == []
    again = harness.output([record(6, offset=6)], now_ms=T0 + 7000)  # it came back
    assert again.goodbyes == []


def test_aggregates_are_emitted_once_per_bucket() -> None:
    rows = Harness().run([[record(i) for i in range(0, 100)], [record(i) for i in range(100, 200)]])
    aggregates = [r for r in rows if r["kind"] == "aggregate" and r["metric"] == "temperature_c"]
    starts = [r["event_ms"] for r in aggregates]
    assert len(starts) == len(set(starts)) >= 2
    assert aggregates[0]["count"] == 60 and aggregates[0]["mean"] == pytest.approx(21.0)


def cleaned(device_type: str, metrics: dict[str, float]) -> tuple[dict[str, float], set[str]]:
    """One reading through :func:`clean_entries`: its metrics, and those out of range."""
    entries = clean_entries(
        np.zeros(len(metrics), dtype=np.int64),
        np.array(list(metrics), dtype=object),
        np.array(list(metrics.values()), dtype=float),
        np.array([device_type], dtype=object),
    )
    return dict(zip(entries.name.tolist(), entries.value.tolist(), strict=True)), set(
        entries.name[entries.out_of_range].tolist()
    )


def test_cleaning_normalises_units_and_flags_out_of_range() -> None:
    assert cleaned("thermostat", {"temperature_f": 212.0}) == ({"temperature_c": 100.0}, {"temperature_c"})
    assert cleaned("thermostat", {"temperature_f": 212.0, "temperature_c": 21.0}) == ({"temperature_c": 21.0}, set())
    assert cleaned("unknown_type", {"whatever": 1e9}) == ({"whatever": 1e9}, set())
    rows = Harness().process(
        [
            record(0, temperature_f=212.0),
            Rec(
                "f",
                Telemetry(
                    v=1,
                    device_id="f",
                    device_type="thermostat",
                    site="h",
                    seq=0,
                    ts=T0,
                    metrics={"temperature_f": 50.0},
                ).to_json(),
                1,
            ),
        ]
    )
    readings = {r["device_id"]: r["metrics"] for r in readings_of(rows)}
    assert readings["th-1"] == {"temperature_c": 21.0}  # the canonical metric wins
    assert readings["f"] == {"temperature_c": pytest.approx(10.0)}
    odd = readings_of(Harness().process([record(0, temperature=100.0)]))[0]
    assert list(odd["out_of_range"]) == ["temperature_c"] and odd["scores"] == {}


def test_state_is_a_few_numbers() -> None:
    harness = Harness()
    harness.process(noisy_series(150, spike_at=120), now_ms=5)
    assert len(harness.store.load_many(["th-1"]).to_bytes(compress=False)) < 2048
    assert harness.state().core.shape == (1, len(CORE_FIELDS))


def test_fleet_model_scores_readings_and_alerts_with_its_version() -> None:
    import pandas as pd

    from iotwatch.models.iforest import IsolationForest

    rng = np.random.default_rng(0)
    normal = pd.DataFrame({"temperature_c": rng.normal(21, 0.2, 3000)})
    model = IsolationForest(seed=0).fit(normal, normal.shift(1).bfill())
    asked: list[str] = []

    def lookup(device_type: str) -> tuple[str, IsolationForest]:
        asked.append(device_type)
        return "isolation_forest@v3", model

    harness = Harness(StreamSettings(fleet_fire_score=0.7), fleet_models=lookup)
    series = [record(i, temperature=21 + float(rng.normal(0, 0.2)) + (9.0 if i == 80 else 0.0)) for i in range(100)]
    alerts = [a for a in alerts_of(harness.run([series[:50], series[50:]])) if a.rule == "fleet_anomaly"]
    assert alerts and alerts[0].state == "raised" and alerts[0].first_event_ms == T0 + 80 * 1000
    assert alerts[0].model_version == "isolation_forest@v3" and asked == ["thermostat", "thermostat"]


def test_outputs_convert_to_the_archive_and_the_tally_layouts(tmp_path) -> None:
    """Every kind of batch -- readings with arrays and extras, a batch with only late and
    malformed records, an empty one -- converts to the archive's Arrow layout (what the
    task writes) and its tally to the operator's Spark output schema."""
    from pyspark.sql.conversion import PandasToArrowConversion

    from iotwatch.streaming.operator_rows import tally_row
    from iotwatch.streaming.schemas import READING_COLUMNS, TALLY_SCHEMA
    from iotwatch.streaming.sinks.archive import ARCHIVE_SCHEMA, ArchiveWriter, archive_table

    harness = Harness()
    odd = Rec(
        "x",
        Telemetry(
            v=1, device_id="x", device_type="lab", site="h", seq=0, ts=T0, metrics={"flux": 1.5, "temperature_c": 99.0}
        ).to_json(),
        1,
    )
    outputs = [
        harness.output(noisy_series(300, spike_at=250)),
        harness.output([record(310, offset=400), record(305, offset=401, ts=T0), Rec("th-1", b"{", 402), odd]),
        Harness().output([]),
    ]
    for out in outputs:
        assert tuple(out.readings.columns) == READING_COLUMNS
        table = archive_table(out.readings, "tail_ensemble")
        assert table.num_rows == len(out.readings)
        assert table.schema == ARCHIVE_SCHEMA
        tally = PandasToArrowConversion.convert(
            tally_row(0, out.counters), TALLY_SCHEMA, timezone="UTC", safecheck=True, assign_cols_by_name=True
        )
        assert tally.num_rows == 1
    assert outputs[0].alerts and len(outputs[0].aggregates)
    assert {d["kind"] for d in outputs[1].dead_letters} == {"late", "dlq"}
    extra = next(r for r in outputs[1].rows() if r["kind"] == "reading" and r["device_id"] == "x")
    assert extra["metrics"] == {"flux": 1.5, "temperature_c": 99.0}  # a type the catalog does not know
    assert extra["scores"] == {"flux": 0.0, "temperature_c": 0.0}  # warming up

    # Written twice for the same offsets (a re-run micro-batch): the same files, no duplicates.
    writer = ArchiveWriter(str(tmp_path), "tail_ensemble")
    for _ in range(2):
        assert writer.write(outputs[1].readings, 3, 400, 402) == 2  # thermostat and lab
    archived = pd.read_parquet(tmp_path / "readings")
    assert sorted(archived["device_id"]) == sorted(outputs[1].readings["device_id"])
    row = archived[archived["device_id"] == "x"].iloc[0]
    assert dict(row["extra_metrics"]) == {"flux": 1.5} and row["metrics"]["temperature_c"] == 99.0
    assert row["metrics"]["humidity_pct"] is None or pd.isna(row["metrics"]["humidity_pct"])
    assert not list((tmp_path / "readings").rglob(".*"))  # no temporary files left behind


def test_the_archive_writes_a_file_per_date_and_device_type_present_each_with_its_rows(tmp_path) -> None:
    from iotwatch.streaming.sinks.archive import ArchiveWriter

    day = 86_400_000
    lab = Telemetry(v=1, device_id="x", device_type="lab", site="h", seq=0, ts=T0, metrics={"flux": 1.5}).to_json()
    out = Harness().output([record(0), record(1, ts=T0 + day), Rec("x", lab, 2)])
    assert ArchiveWriter(str(tmp_path), "tail_ensemble").write(out.readings, 0, 0, 2) == 3  # not the 4th pair
    files = {
        str(f.parent.relative_to(tmp_path / "readings")): pd.read_parquet(f)[["device_id", "seq"]].values.tolist()
        for f in (tmp_path / "readings").rglob("*.parquet")
    }
    assert files == {
        "date=2025-11-22/device_type=thermostat": [["th-1", 0]],
        "date=2025-11-23/device_type=thermostat": [["th-1", 1]],
        "date=2025-11-22/device_type=lab": [["x", 0]],
    }


def test_meter_power_factor_is_derived_and_scored() -> None:
    """A power register spike that looks like a kettle in power alone breaks P = V * I * pf."""
    assert cleaned("smart_meter", {"power_w": 460.0, "voltage_v": 230.0, "current_a": 2.0})[0] == {
        "current_a": 2.0,
        "power_factor": 1.0,
        "power_w": 460.0,
        "voltage_v": 230.0,
    }
    assert "power_factor" not in cleaned("smart_meter", {"power_w": 1.0, "voltage_v": 230.0, "current_a": 0.004})[0]
    assert "power_factor" not in cleaned("thermostat", {"power_w": 460.0, "voltage_v": 230.0, "current_a": 2.0})[0]
    assert (
        cleaned("smart_meter", {"power_w": 460.0, "voltage_v": 230.0, "current_a": 2.0, "power_factor": 0.9})[0][
            "power_factor"
        ]
        == 0.9
    )
    rng = random.Random(4)
    batch = []
    for i in range(400):
        power = 300.0 + (1800.0 if i % 37 == 0 else 0.0) + rng.gauss(0, 3)  # kettles: real, consistent
        voltage = 230.0 + rng.gauss(0, 0.4)
        current = power / (voltage * 0.93)
        if i == 350:
            power += 1800.0  # the register alone jumps
        batch.append(
            record(
                i,
                device="m",
                device_type="smart_meter",
                power_w=round(power, 1),
                voltage_v=round(voltage, 1),
                current_a=round(current, 3),
            )
        )
    raised = [a for a in alerts_of(Harness().run([batch])) if a.state == "raised"]
    assert [(a.rule, a.metric, a.seq) for a in raised] == [("anomaly_score", "power_factor", 350)]


def test_stuck_hvac_fires_on_overshoot_in_the_direction_the_hvac_pushes() -> None:
    """Heating (outside colder than the setpoint) and running 1.5 C above it: stuck on.
    Running 1.5 C below it is a normal warm-up; cooling 1.5 C above it is normal too."""

    def rule_alerts(temperature: float, outside: float, cooling: float | None = None) -> list[str]:
        mode = {} if cooling is None else {"hvac_cooling": cooling}
        batch = [
            record(
                i,
                device="th",
                temperature=temperature,
                setpoint_c=21.0,
                hvac_on=1.0,
                outside_temperature_c=outside,
                **mode,
            )
            for i in range(200)
        ]
        return [a.rule for a in alerts_of(Harness().process(batch))]

    assert "stuck_hvac" in rule_alerts(22.5, outside=5.0)
    assert "stuck_hvac" not in rule_alerts(19.5, outside=5.0)
    assert "stuck_hvac" not in rule_alerts(22.5, outside=30.0)
    assert "stuck_hvac" in rule_alerts(19.5, outside=30.0)
    # the thermostat's own mode outranks the outside temperature: a cooling home's cool night
    assert "stuck_hvac" in rule_alerts(19.5, outside=15.0, cooling=1.0)
    assert "stuck_hvac" not in rule_alerts(22.5, outside=15.0, cooling=1.0)


def test_far_from_a_new_setpoint_settles_for_as_long_as_the_gap_takes_to_close() -> None:
    """Running 6 C below a setpoint just raised (no overshoot): a working HVAC needs hours
    to get there, so 200 s of it raise nothing; 7 h of it (past 6 C / 1 C/h) do."""

    def raised(seconds: int, step_s: int) -> list[str]:
        batch = [
            record(i, device="th", temperature=15.0, setpoint_c=21.0, hvac_on=1.0, outside_temperature_c=5.0)
            for i in range(0, seconds, step_s)
        ]
        return [a.rule for a in alerts_of(Harness().process(batch)) if a.state == "raised"]

    assert raised(200, 1) == []
    assert raised(7 * 3600, 60) == ["stuck_hvac"]


def test_a_clear_speaks_of_the_metric_its_alert_was_raised_on_and_times_are_iso() -> None:
    """The anomaly alert raised on temperature is cleared on temperature (its value and score
    now), even when another metric is the reading's most unusual; the message mentions the
    peak score the record's ``score`` holds. Raise and clear in different batches, so the
    metric goes through the stored state."""
    rng = random.Random(4)
    series = [
        record(
            i,
            temperature=21 + rng.gauss(0, 0.2) + (8.0 if i == 300 else 0.0),
            humidity_pct=43 + rng.gauss(0, 0.3) + (1.2 if i > 300 else 0.0),
        )
        for i in range(400)
    ]
    alerts = alerts_of(Harness().run([series[:301], series[301:]]))
    raised, cleared = [a for a in alerts if a.rule == "anomaly_score"][:2]
    assert (raised.state, cleared.state) == ("raised", "cleared") and raised.metric == "temperature_c"
    assert cleared.contributors[0].metric == "humidity_pct"  # the reading's most unusual metric
    assert cleared.metric == "temperature_c" and cleared.message.split(": ", 1)[1].startswith("temperature_c=")
    assert f"peak score {cleared.score:.2f} while open" in cleared.message

    harness = Harness()
    harness.process([record(i) for i in range(5)], now_ms=1_000)
    silent = alerts_of(harness.silence("th-1", now_ms=120_000))[0]
    assert "(last event time 2025-11-22T04:00:04.000Z)" in silent.message, silent.message
