"""The per-device logic without Spark: dedup, lateness, scoring, alert lifecycle, aggregates."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from iotwatch.contract import Telemetry
from iotwatch.settings import StreamSettings
from streaming.alerting import Episode, Observation, RuleSpec, alert_id, step
from streaming.alerting import AlertContext, DeviceIdentity
from streaming.cleaning import QUALITY_OUT_OF_RANGE, normalise_units, quality_of, with_derived
from streaming.device_logic import DeviceLogic, InputRecord
from streaming.device_state import DeviceState, SeqWindow

T0 = 1_763_784_000_000


def record(seq: int, *, device: str = "th-1", ts: int | None = None, offset: int | None = None,
           temperature: float = 21.0, device_type: str = "thermostat", **metrics: float) -> InputRecord:
    message = Telemetry(v=1, device_id=device, device_type=device_type, site="h1", seq=seq,
                        ts=T0 + seq * 1000 if ts is None else ts,
                        metrics={"temperature_c": temperature, **metrics})
    return InputRecord(device, message.to_json(), 0, seq if offset is None else offset)


def noisy_series(n: int, spike_at: int | None = None, seed: int = 1) -> list[InputRecord]:
    rng = random.Random(seed)
    return [record(i, temperature=21 + rng.gauss(0, 0.2) + (8.0 if i == spike_at else 0.0)) for i in range(n)]


def run(logic: DeviceLogic, batches: list[list[InputRecord]], state: DeviceState | None = None) -> list[dict[str, Any]]:
    state = state or DeviceState()
    out: list[dict[str, Any]] = []
    for batch in batches:
        out.extend(logic.process(state, batch, now_ms=0))
        state = DeviceState.from_json(state.to_json())  # as the state store does between batches
    return out


@pytest.fixture
def logic() -> DeviceLogic:
    return DeviceLogic(StreamSettings())


def alerts_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(r["body"]) for r in rows if r["kind"] == "alert"]


def test_spike_raises_one_alert_then_clears_and_clean_data_stays_quiet(logic: DeviceLogic) -> None:
    quiet = alerts_of(run(logic, [noisy_series(400, seed=2)]))
    assert quiet == []
    alerts = alerts_of(run(logic, [noisy_series(400, spike_at=300)]))
    assert [(a["state"], a["rule"]) for a in alerts] == [("raised", "anomaly_score"), ("cleared", "anomaly_score")]
    raised = alerts[0]
    assert raised["first_event_ms"] == T0 + 300 * 1000 and raised["metric"] == "temperature_c"
    assert raised["alert_id"] == alert_id("th-1", "anomaly_score", T0 + 300 * 1000) == alerts[1]["alert_id"]
    assert raised["contributors"][0]["metric"] == "temperature_c"


def test_results_do_not_depend_on_how_the_stream_is_cut_into_batches(logic: DeviceLogic) -> None:
    series = noisy_series(400, spike_at=300)
    whole = run(logic, [series])
    cut = run(logic, [series[:97], series[97:301], series[301:]])
    strip = lambda rows: [{k: v for k, v in r.items() if k != "body"} for r in rows if r["kind"] not in ("aggregate", "tally")]
    assert strip(whole) == strip(cut)
    ids = lambda rows: [a["alert_id"] for a in alerts_of(rows)]
    assert ids(whole) == ids(cut) and ids(whole)


def test_duplicates_are_counted_not_scored_and_late_records_are_routed(logic: DeviceLogic) -> None:
    state = DeviceState()
    records = [record(i) for i in range(300) if i != 3]
    records += [record(4, offset=300), record(9, offset=301)]  # re-sent
    records.append(record(3, offset=302))  # arrives after seq 299: 296 s older than the newest
    rows = list(logic.process(state, records, now_ms=0))
    kinds = Counter(r["kind"] for r in rows)
    assert kinds["duplicate"] == 2 and kinds["late"] == 1
    assert {r["seq"] for r in rows if r["kind"] == "reading"} == set(range(300)) - {3}
    late = next(r for r in rows if r["kind"] == "late")
    assert json.loads(late["body"])["reason"] == "late" and late["raw"] == records[-1].value
    counters = state.counters
    assert (counters.received, counters.scored, counters.duplicates, counters.late) == (302, 299, 2, 1)
    tally = json.loads(next(r for r in rows if r["kind"] == "tally")["body"])
    assert (tally["received"], tally["scored"], tally["duplicates"], tally["late"]) == (302, 299, 2, 1)


def test_a_clock_stepping_back_is_not_lateness(logic: DeviceLogic) -> None:
    """Readings that come in seq order but stamped 200 s back (the device's clock was
    reset) are scored, counted as clock steps, and do not overwrite emitted aggregates."""
    state = DeviceState()
    before = list(logic.process(state, [record(i) for i in range(300)], now_ms=0))
    stepped = [record(300 + i, ts=T0 + (300 + i) * 1000 - 200_000) for i in range(60)]  # into emitted minutes
    after = list(logic.process(state, stepped, now_ms=0))
    assert {r["seq"] for r in after if r["kind"] == "reading"} == set(range(300, 360))
    assert not [r for r in after if r["kind"] == "late"]
    assert (state.counters.clock_steps, state.counters.late, state.counters.scored) == (60, 0, 360)
    emitted = {(r["event_ms"], r["metric"]) for r in before if r["kind"] == "aggregate"}
    assert emitted and not emitted & {(r["event_ms"], r["metric"]) for r in after if r["kind"] == "aggregate"}


def test_out_of_order_within_lateness_is_scored(logic: DeviceLogic) -> None:
    rows = list(logic.process(DeviceState(), [record(1, offset=0), record(0, offset=1)], now_ms=0))
    assert sorted(r["seq"] for r in rows if r["kind"] == "reading") == [0, 1]


def test_malformed_and_mismatched_records_go_to_dead_letters(logic: DeviceLogic) -> None:
    state = DeviceState()
    bad = [InputRecord("th-1", b"{nope", 0, 0), InputRecord("th-1", None, 0, 1),
           InputRecord("th-1", record(0, device="other").value, 0, 2)]
    rows = [r for r in logic.process(state, bad, now_ms=0) if r["kind"] != "tally"]
    reasons = [json.loads(r["body"])["reason"] for r in rows]
    assert reasons == ["invalid_json", "invalid_json", "key_mismatch"]
    assert all(r["kind"] == "dlq" and r["device_id"] == "th-1" for r in rows)


def test_seq_window_detects_duplicates_and_counter_resets() -> None:
    window = SeqWindow()
    assert [window.observe(s, 64) for s in (0, 1, 3, 2, 3, 1)] == ["new", "new", "new", "new", "duplicate", "duplicate"]
    assert window.observe(500, 64) == "new" and window.observe(400, 64) == "reset"


def test_anti_flap_hold_and_clear_threshold() -> None:
    spec = RuleSpec("r", "major", fire=0.8, clear=0.4, hold=2, clear_hold=2)
    ctx = AlertContext(DeviceIdentity("d", "thermostat", "h"), now_ms=lambda: 0)
    episode = Episode()
    scores = [0.9, 0.3, 0.9, 0.9, 0.5, 0.85, 0.6, 0.3, 0.9, 0.3, 0.2]
    events = [step(episode, spec, Observation(s, "m", s, 0.8, "x"), i, i, ctx) for i, s in enumerate(scores)]
    states = [(i, e["state"], e["occurrences"]) for i, e in enumerate(events) if e]
    # one blip does not fire; two in a row do; hovering between clear and fire keeps it open
    # (and counts repeats); two readings below clear close it.
    assert states == [(3, "raised", 2), (10, "cleared", 4)]
    assert events[3]["alert_id"] == alert_id("d", "r", 2)


def test_rules_fire_for_crash_harsh_braking_leak_stuck_hvac_and_out_of_range(logic: DeviceLogic) -> None:
    state = DeviceState()
    crash = [record(0, device="car", device_type="vehicle_edr", temperature=20, speed_kmh=50.0, accel_x_g=-7.0)]
    harsh = [record(0, device="van", device_type="vehicle_edr", temperature=20, speed_kmh=40.0, accel_x_g=-0.8)]
    leak = [record(0, device="leak", device_type="leak_sensor", water_detected=1.0)]
    hvac = [record(i, device="th", temperature=30.0, setpoint_c=21.0, hvac_on=1.0) for i in range(150)]
    odd = [record(0, device="x", temperature=999.0)]
    raised = {}
    for batch in (crash, harsh, leak, hvac, odd):
        state = DeviceState()
        for alert in alerts_of(list(logic.process(state, batch, now_ms=0))):
            raised[alert["rule"]] = alert
    assert set(raised) == {"crash", "harsh_braking", "water_leak", "stuck_hvac", "out_of_range"}
    assert raised["crash"]["severity"] == "critical" and raised["out_of_range"]["value"] == 999.0
    assert raised["harsh_braking"]["severity"] == "warning" and raised["harsh_braking"]["device_id"] == "van"
    assert raised["stuck_hvac"]["occurrences"] == 121  # held for the configured 120 s (readings every 1 s)


def test_silence_raises_device_silent_and_data_clears_it(logic: DeviceLogic) -> None:
    state = DeviceState()
    list(logic.process(state, [record(i) for i in range(5)], now_ms=1_000))
    silent = alerts_of(list(logic.silence(state, now_ms=120_000)))
    assert [(a["rule"], a["state"]) for a in silent] == [("device_silent", "raised")]
    back = alerts_of(list(logic.process(state, [record(5)], now_ms=130_000)))
    assert [(a["rule"], a["state"], a["alert_id"]) for a in back] == [("device_silent", "cleared", silent[0]["alert_id"])]


def _appended(rec: InputRecord, append_ms: int) -> InputRecord:
    return InputRecord(rec.key, rec.value, rec.partition, rec.offset, append_ms)


def test_a_gap_in_the_log_raises_device_silent_once_even_inside_one_batch(logic: DeviceLogic) -> None:
    """A job catching up on a backlog sees the silence in the records' Kafka timestamps,
    with the alert id the processing-time timer gives; a gap the timer already reported
    is not raised twice."""
    timeout_ms = int(logic.settings.silence_timeout_s * 1000)
    before = [_appended(record(i), T0 + i * 1000) for i in range(5)]
    resumed = T0 + 4000 + timeout_ms + 5000
    after = [_appended(record(5 + i), resumed + i * 1000) for i in range(3)]

    state = DeviceState()
    in_one_batch = alerts_of(list(logic.process(state, before + after, now_ms=resumed + 3000)))
    assert [(a["rule"], a["state"]) for a in in_one_batch] == [("device_silent", "raised"),
                                                              ("device_silent", "cleared")]
    assert in_one_batch[0]["first_event_ms"] == T0 + 4000 and "in the log" in in_one_batch[0]["message"]

    timed = DeviceState()
    list(logic.process(timed, before, now_ms=T0 + 4000))
    by_timer = alerts_of(list(logic.silence(timed, now_ms=T0 + 4000 + timeout_ms)))
    back = alerts_of(list(logic.process(timed, after, now_ms=resumed + 3000)))
    assert [(a["state"], a["alert_id"]) for a in by_timer + back] == [
        ("raised", in_one_batch[0]["alert_id"]), ("cleared", in_one_batch[0]["alert_id"])]

    steady = DeviceState()  # readings closer together than the timeout: nothing
    assert alerts_of(list(logic.process(steady, [_appended(record(i), T0 + i * 1000) for i in range(50)]))) == []


def test_aggregates_are_emitted_once_per_bucket(logic: DeviceLogic) -> None:
    state = DeviceState()
    rows = run(logic, [[record(i) for i in range(0, 100)], [record(i) for i in range(100, 200)]], state)
    aggregates = [r for r in rows if r["kind"] == "aggregate" and r["metric"] == "temperature_c"]
    starts = [r["event_ms"] for r in aggregates]
    assert len(starts) == len(set(starts)) >= 2
    assert json.loads(aggregates[0]["body"])["count"] == 60


def test_cleaning_normalises_units_and_flags_out_of_range() -> None:
    assert normalise_units({"temperature_f": 212.0}) == {"temperature_c": 100.0}
    assert quality_of("thermostat", "temperature_c", 100.0) == QUALITY_OUT_OF_RANGE
    assert quality_of("unknown_type", "whatever", 1e9) == "ok"


def test_state_round_trips_through_json(logic: DeviceLogic) -> None:
    state = DeviceState()
    list(logic.process(state, noisy_series(150, spike_at=120), now_ms=5))
    again = DeviceState.from_json(state.to_json())
    assert again == state
    assert len(state.to_json()) < 8_000  # a few numbers per metric, not a model


def test_fleet_model_scores_readings_and_alerts_with_its_version() -> None:
    import numpy as np
    import pandas as pd

    from models.iforest import IsolationForest

    rng = np.random.default_rng(0)
    normal = pd.DataFrame({"temperature_c": rng.normal(21, 0.2, 3000)})
    model = IsolationForest(seed=0).fit(normal, normal.shift(1).bfill())
    asked: list[str] = []

    def lookup(device_type: str) -> tuple[str, IsolationForest]:
        asked.append(device_type)
        return "isolation_forest@v3", model

    logic = DeviceLogic(StreamSettings(fleet_fire_score=0.7), fleet_models=lookup)
    series = [record(i, temperature=21 + float(rng.normal(0, 0.2)) + (9.0 if i == 80 else 0.0)) for i in range(100)]
    alerts = [a for a in alerts_of(run(logic, [series[:50], series[50:]])) if a["rule"] == "fleet_anomaly"]
    assert alerts and alerts[0]["state"] == "raised" and alerts[0]["first_event_ms"] == T0 + 80 * 1000
    assert alerts[0]["model_version"] == "isolation_forest@v3" and asked == ["thermostat", "thermostat"]


def test_output_of_a_batch_without_readings_converts_to_arrow(logic: DeviceLogic) -> None:
    """A device whose batch holds only late records emits no metric: the all-None string
    columns must still convert the way Spark converts them (a float-NaN column did not)."""
    from pyspark.sql.conversion import PandasToArrowConversion

    from streaming.processor import _frame
    from streaming.schemas import OUTPUT_SCHEMA

    state = DeviceState()
    list(logic.process(state, [record(i) for i in range(300, 305)], now_ms=0))
    rows = list(logic.process(state, [record(1, offset=10), record(2, offset=11)], now_ms=0))
    assert {r["kind"] for r in rows} == {"late", "tally"}
    batch = PandasToArrowConversion.convert(_frame(rows), OUTPUT_SCHEMA, timezone="UTC", safecheck=True,
                                            assign_cols_by_name=True)
    assert batch.num_rows == len(rows) and batch.column(OUTPUT_SCHEMA.names.index("metric")).null_count == len(rows)


def test_meter_power_factor_is_derived_and_scored(logic: DeviceLogic) -> None:
    """A power register spike that looks like a kettle in power alone breaks P = V * I * pf."""
    assert with_derived("smart_meter", {"power_w": 460.0, "voltage_v": 230.0, "current_a": 2.0}) == {
        "power_w": 460.0, "voltage_v": 230.0, "current_a": 2.0, "power_factor": 1.0}
    assert "power_factor" not in with_derived("smart_meter", {"power_w": 1.0, "voltage_v": 230.0, "current_a": 0.004})
    assert "power_factor" not in with_derived("thermostat", {"power_w": 460.0, "voltage_v": 230.0, "current_a": 2.0})
    rng = random.Random(4)
    batch = []
    for i in range(400):
        power = 300.0 + (1800.0 if i % 37 == 0 else 0.0) + rng.gauss(0, 3)  # kettles: real, consistent
        voltage = 230.0 + rng.gauss(0, 0.4)
        current = power / (voltage * 0.93)
        if i == 350:
            power += 1800.0  # the register alone jumps
        batch.append(record(i, device="m", device_type="smart_meter", power_w=round(power, 1),
                            voltage_v=round(voltage, 1), current_a=round(current, 3)))
    raised = [a for a in alerts_of(run(logic, [batch])) if a["state"] == "raised"]
    assert [(a["rule"], a["metric"], a["seq"]) for a in raised] == [("anomaly_score", "power_factor", 350)]


def test_stuck_hvac_fires_on_overshoot_in_the_direction_the_hvac_pushes(logic: DeviceLogic) -> None:
    """Heating (outside colder than the setpoint) and running 1.5 C above it: stuck on.
    Running 1.5 C below it is a normal warm-up; cooling 1.5 C above it is normal too."""
    def rule_alerts(temperature: float, outside: float) -> list[str]:
        batch = [record(i, device="th", temperature=temperature, setpoint_c=21.0, hvac_on=1.0,
                        outside_temperature_c=outside) for i in range(200)]
        return [a["rule"] for a in alerts_of(list(logic.process(DeviceState(), batch, now_ms=0)))]
    assert "stuck_hvac" in rule_alerts(22.5, outside=5.0)
    assert "stuck_hvac" not in rule_alerts(19.5, outside=5.0)
    assert "stuck_hvac" not in rule_alerts(22.5, outside=30.0)
    assert "stuck_hvac" in rule_alerts(19.5, outside=30.0)
