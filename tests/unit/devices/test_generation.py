"""Message generation without a broker: contract, determinism, seq, ground truth, physics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from iotwatch.contract.device_topics import parse_device_topic
from iotwatch.contract.metric_catalog import DEVICE_METRICS
from iotwatch.contract.telemetry import GOODBYE_EVENT, ContractViolation, DeviceType, decode_telemetry
from iotwatch.devices.config import SimConfig
from iotwatch.devices.faults import corrupt
from iotwatch.devices.scenario import ScenarioError, load_scenario
from iotwatch.devices.simulation import STATUS, Simulation
from tests.support.devices import START_MS, generate, telemetry_by_device


def _scenario(tmp_path: Path, entries: list[dict]) -> Path:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps({"anomalies": entries}))
    return path


def test_every_message_follows_the_contract_and_seq_is_gap_free() -> None:
    config = SimConfig(seed=5, homes=6, vehicles=2, start_ms=START_MS)
    messages = generate(config, 30)
    assert messages
    seen_types = set()
    for _, topic, payload, group in messages:
        assert group != STATUS
        message = decode_telemetry(payload.encode(), now_ms=START_MS + 60_000)
        site, device_type, device_id, kind = parse_device_topic(topic)
        assert (site, device_type, device_id, kind) == (
            message.site,
            message.device_type,
            message.device_id,
            "telemetry",
        )
        assert set(message.metrics) == set(DEVICE_METRICS[device_type])
        seen_types.add(device_type)
    assert seen_types == {t.value for t in DeviceType}
    for device_id, readings in telemetry_by_device(messages).items():
        assert [m["seq"] for m in readings] == list(range(len(readings))), device_id
        assert all(b["ts"] > a["ts"] for a, b in zip(readings, readings[1:], strict=False)), device_id
    vehicle = telemetry_by_device(messages)["vehicle-00000"]
    assert len(vehicle) in (299, 300)  # 10 Hz for 30 s (phase offset)


def test_same_seed_same_messages_and_process_count_does_not_matter(tmp_path: Path) -> None:
    config = SimConfig(seed=11, homes=5, vehicles=2, start_ms=START_MS, anomaly_rate=20.0, fault_rate=20.0)
    first = generate(config, 60)
    assert first == generate(config, 60)
    sharded = generate(config, 60, 0, 2) + generate(config, 60, 1, 2)

    def per_device(messages):
        out = {}
        for uid, _, payload, _ in messages:
            out.setdefault(uid, []).append(payload)
        return out

    assert per_device(first) == per_device(sharded)
    assert first != generate(config.model_copy(update={"seed": 12}), 60)


def test_homes_differ_and_types_mix() -> None:
    sim = Simulation(SimConfig(seed=3, homes=30, vehicles=0, start_ms=START_MS))
    homes = sim.fleet.homes
    assert homes is not None and len(set(np.round(homes.outside_mean_c, 3))) == 30
    assert len(set(homes.people.tolist())) > 1
    counts = sim.fleet.device_counts
    assert counts["smart_meter"] == 30 and 0 < counts["air_quality"] < 30


def test_ground_truth_matches_injected_changes(tmp_path: Path) -> None:
    base = SimConfig(seed=2, homes=2, vehicles=0, start_ms=START_MS, mix={"thermostat": 1, "smart_meter": 1})
    plan = _scenario(
        tmp_path,
        [
            {"kind": "spike", "devices": "home-00000-thermostat-0", "at_s": 10, "magnitude": 9.0},
            {
                "kind": "level_shift",
                "devices": "home-00001-smart_meter-0",
                "at_s": 20,
                "duration_s": 5,
                "magnitude": 500,
            },
            {"kind": "dropout", "devices": "home-00001-thermostat-0", "at_s": 30, "duration_s": 4},
            {"kind": "duplicate", "devices": "home-00000-smart_meter-0", "at_s": 40, "duration_s": 0, "copies": 2},
            {"kind": "malformed", "devices": "home-00000-thermostat-0", "at_s": 50, "variant": "truncated"},
            {"kind": "out_of_order", "devices": "home-00001-smart_meter-0", "at_s": 45, "depth": 2},
            {"kind": "clock_skew", "devices": "home-00000-smart_meter-0", "at_s": 52, "duration_s": 2, "skew_s": 3600},
        ],
    )
    sim = Simulation(base.model_copy(update={"scenario": plan}))
    messages = [m for batch in sim.run(70) for m in batch]
    clean = telemetry_by_device(generate(base, 70))
    dirty = telemetry_by_device(messages)
    truth = {r.kind: r for r in sim.injector.records}
    assert set(truth) == {"spike", "level_shift", "dropout", "duplicate", "malformed", "out_of_order", "clock_skew"}

    spike = truth["spike"]
    assert spike.start_seq == spike.end_seq and spike.messages == 1 and spike.start_ts >= START_MS + 10_000
    thermo_clean = {m["seq"]: m for m in clean["home-00000-thermostat-0"]}
    thermo_dirty = {m["seq"]: m for m in dirty["home-00000-thermostat-0"]}
    for seq, message in thermo_dirty.items():
        delta = message["metrics"]["temperature_c"] - thermo_clean[seq]["metrics"]["temperature_c"]
        assert delta == pytest.approx(9.0 if seq == spike.start_seq else 0.0, abs=0.02)

    shift = truth["level_shift"]
    meter_clean = {m["seq"]: m for m in clean["home-00001-smart_meter-0"]}
    for message in dirty["home-00001-smart_meter-0"]:
        inside = shift.start_seq <= message["seq"] <= shift.end_seq
        delta = message["metrics"]["power_w"] - meter_clean[message["seq"]]["metrics"]["power_w"]
        assert delta == pytest.approx(500.0 if inside else 0.0, abs=0.2)
    assert shift.end_ts - shift.start_ts <= 5_000

    dropout = truth["dropout"]
    seqs = [m["seq"] for m in dirty["home-00001-thermostat-0"]]
    missing = sorted(set(range(max(seqs) + 1)) - set(seqs))
    assert missing == list(range(dropout.start_seq, dropout.end_seq + 1)) and len(missing) >= 4
    statuses = [json.loads(p)["state"] for _, topic, p, g in messages if g == STATUS]
    assert statuses == ["lost", "online"]

    duplicate = truth["duplicate"]
    meter0 = [m["seq"] for m in dirty["home-00000-smart_meter-0"]]
    assert meter0.count(duplicate.start_seq) == 3 and duplicate.params["copies"] == 2

    malformed = truth["malformed"]
    bad = [p for _, topic, p, _ in messages if "home-00000-thermostat-0" in topic and not _valid(p)]
    assert len(bad) == 1 and malformed.messages == 1
    assert malformed.start_seq not in thermo_dirty

    order = [m["seq"] for m in dirty["home-00001-smart_meter-0"]]
    moved = truth["out_of_order"].start_seq
    assert order.index(moved) == order.index(moved + 2) + 1  # arrives after the next two

    skew = truth["clock_skew"]
    for message in dirty["home-00000-smart_meter-0"]:
        clean_ts = {m["seq"]: m["ts"] for m in clean["home-00000-smart_meter-0"]}[message["seq"]]
        inside = skew.start_seq <= message["seq"] <= skew.end_seq
        assert message["ts"] - clean_ts == (3_600_000 if inside else 0)


def _valid(payload) -> bool:
    try:
        decode_telemetry(payload if isinstance(payload, bytes) else payload.encode(), now_ms=START_MS)
        return True
    except ContractViolation:
        return False


@pytest.mark.parametrize(
    "variant",
    ["truncated", "not_json", "invalid_utf8", "missing_field", "wrong_type", "nan", "unknown_field", "bad_version"],
)
def test_malformed_variants_are_contract_violations(variant: str) -> None:
    config = SimConfig(seed=1, homes=1, vehicles=0, start_ms=START_MS, mix={"thermostat": 1})
    payload = generate(config, 2)[0][2]
    assert _valid(payload)
    assert not _valid(corrupt(payload, variant))


def test_rate_based_injection_is_recorded_and_deterministic(tmp_path: Path) -> None:
    config = SimConfig(
        seed=9,
        homes=4,
        vehicles=1,
        start_ms=START_MS,
        anomaly_rate=60.0,
        fault_rate=60.0,
        anomaly_kinds=("spike", "flatline", "dropout", "out_of_range"),
        tick_ms=1000,
    )
    runs = []
    for _ in range(2):
        sim = Simulation(config)
        for _batch in sim.run(300):
            pass
        runs.append(sim.injector.records)
    assert runs[0] == runs[1] and runs[0]
    kinds = {r.kind for r in runs[0]}
    assert kinds <= {
        "spike",
        "flatline",
        "dropout",
        "out_of_range",
        "duplicate",
        "out_of_order",
        "late",
        "clock_skew",
        "malformed",
    }
    assert {"spike", "flatline"} <= kinds
    for record in runs[0]:
        assert record.start_seq <= record.end_seq and record.start_ts <= record.end_ts
        assert record.messages >= 1


def test_anomalies_after_keeps_the_warm_up_free_of_anomalies_only() -> None:
    base = SimConfig(
        seed=9,
        homes=4,
        vehicles=1,
        start_ms=START_MS,
        anomaly_rate=60.0,
        fault_rate=60.0,
        anomaly_kinds=("spike", "flatline", "dropout", "out_of_range"),
        tick_ms=1000,
    )
    records = {}
    for after in (0.0, 120.0):
        sim = Simulation(base.model_copy(update={"anomalies_after_s": after}))
        for _batch in sim.run(300):
            pass
        records[after] = sim.injector.records
    early = [r for r in records[0.0] if r.category == "anomaly" and r.start_ts < START_MS + 120_000]
    assert early, "the rate gives anomalies within the first 120 s without a warm-up"
    anomalies = [r for r in records[120.0] if r.category == "anomaly"]
    assert anomalies and min(r.start_ts for r in anomalies) >= START_MS + 120_000
    assert any(r.category == "transport" and r.start_ts < START_MS + 120_000 for r in records[120.0])


def test_a_bounded_run_holds_whole_anomalies_only() -> None:
    """With --duration known, rate-drawn anomalies end a few readings before the run does
    (a drift reaches its full size, a dropout is followed by data), so the ground truth
    never describes an anomaly cut off by the end."""
    config = SimConfig(
        seed=5,
        homes=4,
        vehicles=0,
        rate=1.0,
        start_ms=START_MS,
        duration_s=600.0,
        anomaly_rate=30.0,
        anomaly_kinds=("drift", "dropout", "level_shift", "flatline"),
        tick_ms=1000,
    )
    unbounded = Simulation(config.model_copy(update={"duration_s": None}))
    bounded = Simulation(config)
    for sim in (unbounded, bounded):
        for _batch in sim.run(600):
            pass
    run_end = START_MS + 600_000
    cut = [r for r in unbounded.injector.records if r.category == "anomaly" and r.end_ts >= run_end - 2000]
    assert cut, "without a known end some anomalies run into it"
    anomalies = [r for r in bounded.injector.records if r.category == "anomaly"]
    assert anomalies and max(r.end_ts for r in anomalies) <= run_end - 5000


def test_physics_stays_plausible_over_two_days() -> None:
    config = SimConfig(seed=4, homes=12, vehicles=0, rate=1 / 60, start_ms=START_MS, tick_ms=60_000)
    by_device = telemetry_by_device(generate(config, 2 * 86400))
    temps, co2 = [], []
    for device_id, readings in by_device.items():
        device_type = readings[0]["device_type"]
        for m in readings:
            for metric, value in m["metrics"].items():
                _, low, high = DEVICE_METRICS[device_type][metric]
                assert low <= value <= high, (device_id, metric, value)
        if device_type == "thermostat":
            temps.extend(m["metrics"]["temperature_c"] for m in readings)
        if device_type == "air_quality":
            co2.extend(m["metrics"]["co2_ppm"] for m in readings)
        if device_type == "smart_meter":
            energy = [m["metrics"]["energy_kwh"] for m in readings]
            assert energy == sorted(energy)
    assert 12.0 < min(temps) and max(temps) < 32.0
    assert max(co2) - min(co2) > 300  # occupancy drives CO2 up and ventilation down


def test_normal_driving_stays_within_physical_ranges() -> None:
    config = SimConfig(seed=5, homes=0, vehicles=4, start_ms=START_MS)
    by_device = telemetry_by_device(generate(config, 1800))
    for device_id, readings in by_device.items():
        for m in readings:
            for metric, value in m["metrics"].items():
                _, low, high = DEVICE_METRICS["vehicle_edr"][metric]
                assert low <= value <= high, (device_id, metric, value)


def test_stuck_hvac_makes_the_room_run_away(tmp_path: Path) -> None:
    base = SimConfig(seed=4, homes=6, vehicles=0, rate=1 / 30, start_ms=START_MS, mix={"thermostat": 1}, tick_ms=30_000)
    plan = _scenario(tmp_path, [{"kind": "stuck_hvac", "devices": "*", "at_s": 3600, "duration_s": 6 * 3600}])
    clean = telemetry_by_device(generate(base, 8 * 3600))
    stuck = telemetry_by_device(generate(base.model_copy(update={"scenario": plan}), 8 * 3600))
    for device_id, readings in stuck.items():
        end = max(m["metrics"]["temperature_c"] for m in readings)
        normal = max(m["metrics"]["temperature_c"] for m in clean[device_id])
        setpoint = max(m["metrics"]["setpoint_c"] for m in readings)
        assert abs(end - setpoint) > 3.0 or abs(min(m["metrics"]["temperature_c"] for m in readings) - setpoint) > 3.0
        assert normal < setpoint + 1.5


def test_crash_event_carries_the_pre_event_buffer(tmp_path: Path) -> None:
    plan = _scenario(tmp_path, [{"kind": "crash", "devices": "vehicle-*", "at_s": 120}])
    config = SimConfig(seed=8, homes=0, vehicles=3, start_ms=START_MS, scenario=plan)
    sim = Simulation(config)
    messages = [m for batch in sim.run(400) for m in batch]
    crashes = [json.loads(p) for _, _, p, g in messages if g != STATUS and '"event":"crash"' in p]
    assert len(crashes) == 3
    for event in crashes:
        decode_telemetry(json.dumps(event).encode(), now_ms=START_MS)
        data = event["event_data"]
        readings = data["readings"]
        assert data["samples"] == 50 and len(readings["ts"]) == 50  # 5 s at 10 Hz
        assert readings["ts"][-1] == event["ts"] - 100 and readings["ts"][0] == event["ts"] - 5000
        assert set(readings) == {"ts", *DEVICE_METRICS["vehicle_edr"]}
        assert event["metrics"]["accel_x_g"] <= -4.0 and event["metrics"]["speed_kmh"] == 0
        assert readings["speed_kmh"][-1] > 15.0
        history = {m["ts"]: m for m in telemetry_by_device(messages)[event["device_id"]]}
        for k, ts in enumerate(readings["ts"]):  # the buffer holds what was published
            assert readings["speed_kmh"][k] == pytest.approx(history[ts]["metrics"]["speed_kmh"])
    records = [r for r in sim.injector.records if r.kind == "crash"]
    assert len(records) == 3 and all(r.start_ts in {c["ts"] for c in crashes} for r in records)


def test_normal_driving_never_triggers_the_recorder() -> None:
    config = SimConfig(seed=6, homes=0, vehicles=10, vehicle_hz=5, start_ms=START_MS, tick_ms=1000)
    messages = generate(config, 900)
    by_device = telemetry_by_device(messages)
    assert not any("event" in m for readings in by_device.values() for m in readings)
    speeds = [m["metrics"]["speed_kmh"] for readings in by_device.values() for m in readings]
    assert max(speeds) > 50 and min(speeds) == 0.0
    moved = [
        abs(r[-1]["metrics"]["lat_deg"] - r[0]["metrics"]["lat_deg"])
        + abs(r[-1]["metrics"]["lon_deg"] - r[0]["metrics"]["lon_deg"])
        for r in by_device.values()
    ]
    assert sum(x > 1e-3 for x in moved) >= 5


def test_leak_raises_events(tmp_path: Path) -> None:
    plan = _scenario(tmp_path, [{"kind": "water_leak", "devices": "*", "at_s": 5, "duration_s": 10}])
    config = SimConfig(seed=1, homes=2, vehicles=0, start_ms=START_MS, mix={"leak_sensor": 1}, scenario=plan)
    by_device = telemetry_by_device(generate(config, 30))
    for readings in by_device.values():
        events = [(m["event"], m["metrics"]["water_detected"]) for m in readings if "event" in m]
        assert events == [("leak_detected", 1), ("leak_cleared", 0)]


def test_replay_streams_a_recorded_csv(nab_dir: Path) -> None:
    path = nab_dir / "data" / "artificialWithAnomaly" / "art_daily_jumpsup.csv"
    rows = path.read_text().splitlines()[1:]
    config = SimConfig(seed=1, homes=0, vehicles=0, replay=(path,), start_ms=START_MS, tick_ms=60_000)
    sim = Simulation(config)
    messages = [m for batch in sim.run(20 * 86400) for m in batch]
    readings = telemetry_by_device(messages)["art_daily_jumpsup"]
    assert len(readings) == len(rows) and sim.exhausted
    assert [m["metrics"]["value"] for m in readings[:3]] == pytest.approx([float(r.split(",")[1]) for r in rows[:3]])
    assert readings[0]["ts"] == START_MS and readings[1]["ts"] - readings[0]["ts"] == 300_000
    assert [m["seq"] for m in readings] == list(range(len(rows)))


def test_scenario_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="unknown anomaly kind"):
        load_scenario(_scenario(tmp_path, [{"kind": "gremlins"}]))
    with pytest.raises(ScenarioError, match="at_s"):
        load_scenario(_scenario(tmp_path, [{"kind": "spike", "at_s": -1}]))
    toml = tmp_path / "s.toml"
    toml.write_text('[[anomalies]]\nkind = "drift"\ndevices = "home-*"\nat_s = 5\n')
    assert load_scenario(toml).anomalies[0].kind == "drift"


def test_a_second_run_carries_on_each_devices_seq_from_the_state_file(tmp_path: Path) -> None:
    """What the first run ends with (seq_end, saved by the runner) is where the second starts,
    device by device; a device new to the file starts at 0."""
    from iotwatch.devices import seq_state

    state = tmp_path / "seq.json"
    first = Simulation(SimConfig(seed=5, homes=2, vehicles=1, start_ms=START_MS, seq_state=state))
    first_messages = telemetry_by_device([m for batch in first.run(60) for m in batch])
    assert first.carried_on == 0
    ends = first.seq_end()
    assert {d: seq for d, (seq, _) in ends.items()} == {d: r[-1]["seq"] + 1 for d, r in first_messages.items()}
    assert all(ts == r[-1]["ts"] for d, r in first_messages.items() for ts in [ends[d][1]])
    ends.pop("vehicle-00000")  # as if the vehicle were new
    seq_state.save(state, ends)

    second = Simulation(SimConfig(seed=5, homes=2, vehicles=1, start_ms=START_MS + 60_000, seq_state=state))
    second_messages = telemetry_by_device([m for batch in second.run(30) for m in batch])
    assert second.carried_on == len(ends)
    for device, readings in second_messages.items():
        start = ends[device][0] if device in ends else 0
        assert [r["seq"] for r in readings] == list(range(start, start + len(readings)))


def test_a_damaged_seq_state_file_is_an_error_that_names_it(tmp_path: Path) -> None:
    from iotwatch.devices import seq_state

    state = tmp_path / "seq.json"
    state.write_text("{not json")
    with pytest.raises(ValueError, match=f"seq state file {state}"):
        seq_state.load(state)


def test_a_clean_stop_is_one_goodbye_reading_per_device_carrying_on_its_seq() -> None:
    """``Simulation.goodbye``: every device's last reading is valid telemetry with the
    goodbye event, its seq one past the device's last, its event time not before it."""
    sim = Simulation(SimConfig(seed=4, homes=3, vehicles=1, start_ms=START_MS))
    last: dict[str, tuple[int, int]] = {}
    for _ in range(30):
        for _uid, _topic, payload, _group in sim.tick():
            if isinstance(payload, str) and '"seq"' in payload:
                message = decode_telemetry(payload.encode())
                last[message.device_id] = (message.seq, message.ts)
    readings = sim.readings
    goodbyes = [decode_telemetry(payload.encode()) for _uid, _topic, payload, _group in sim.goodbye()]
    assert sorted(m.device_id for m in goodbyes) == sorted(sim._where)
    assert all(m.event == GOODBYE_EVENT for m in goodbyes)
    for message in goodbyes:
        seq, ts = last[message.device_id]
        assert message.seq == seq + 1 and message.ts >= ts
    assert sim.readings == readings + len(goodbyes) and sim.events[GOODBYE_EVENT] == len(goodbyes)
