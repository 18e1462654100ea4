"""The simulated end-to-end evaluation: deterministic, and the obvious kinds are alerted on."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from iotwatch.application.cli import cli
from iotwatch.evaluation.judgement import RaisedAlert
from iotwatch.evaluation.simulated import (
    GOALS,
    RECOMMENDED,
    check_goals,
    evaluate_fleet,
    match,
    run_alerts,
    settings_for,
    simulate,
)
from tests.helpers import injection

OBVIOUS = ("spike", "water_leak", "crash", "out_of_range", "dropout")
MIX = {"thermostat": 1, "smart_meter": 1, "door_sensor": 1, "leak_sensor": 1}


def _fleet():
    # 3 homes of 4 devices + 1 vehicle, 12 h of event time, many anomalies of the obvious kinds
    return simulate(homes=3, vehicles=1, days=0.5, seed=5, anomalies_per_day=16.0, kinds=OBVIOUS, mix=MIX)


@pytest.fixture(scope="module")
def fleet():
    return _fleet()


@pytest.fixture(scope="module")
def defaults(fleet):
    return evaluate_fleet(fleet)


@pytest.fixture(scope="module")
def recommended(fleet):
    return evaluate_fleet(fleet, RECOMMENDED)


def _strip(report: dict) -> dict:
    return {k: v for k, v in report.items() if k != "seconds"}


def test_generation_and_evaluation_are_deterministic(fleet, defaults) -> None:
    again = _fleet()
    assert again.truth == fleet.truth
    assert {d: s.messages for d, s in again.devices.items()} == {d: s.messages for d, s in fleet.devices.items()}
    first, second = defaults, evaluate_fleet(again)
    assert _strip(first) == _strip(second)
    json.dumps(first)  # JSON-able
    assert first["overall"]["windows"] == sum(k["windows"] for k in first["kinds"].values())


@pytest.mark.parametrize("kind", ["water_leak", "crash", "out_of_range", "dropout"])
def test_rule_kinds_are_detected_with_the_current_defaults(defaults, kind: str) -> None:
    stats = defaults["kinds"][kind]
    assert stats["windows"] >= 1, stats
    assert stats["recall"] >= 0.9, stats
    assert stats["median_delay_readings"] <= 3, stats


def test_spikes_are_reliably_detected_at_once(defaults, recommended) -> None:
    """Single-reading spikes are alerted on at the spike itself; the recommended settings
    keep every kind detected."""
    for report in (defaults, recommended):
        spike = report["kinds"]["spike"]
        assert spike["recall"] >= 0.8 and spike["median_delay_readings"] == 0, spike
        for kind in ("water_leak", "crash", "out_of_range", "dropout"):
            assert report["kinds"][kind]["recall"] >= 0.9, (kind, report["kinds"][kind])
    assert defaults["overall"]["false_alarms_per_device_day"] <= 1.0, defaults["overall"]


def test_the_detection_goals_hold_on_a_mixed_fleet() -> None:
    """The detection goals, on every kind the simulator injects into 4 homes and a vehicle
    over a day (the full-size figures come from ``iotwatch evaluate --simulated``)."""
    report = evaluate_fleet(simulate(homes=4, vehicles=1, days=1.0, seed=11, anomalies_per_day=4.0))
    overall = report["overall"]
    assert overall["windows"] >= 50 and len(report["kinds"]) >= 8, report["kinds"].keys()
    assert overall["recall"] >= 0.95, {k: (v["detected"], v["windows"]) for k, v in report["kinds"].items()}
    assert overall["false_alarms_per_device_day"] <= 1.0, report["rules"]
    assert overall["median_delay_readings"] <= 3, overall


def test_evaluate_reports_each_goal_with_its_verdict_drift_delay_in_seconds_included() -> None:
    """``evaluate --simulated`` reports every detection goal per configuration -- the drift
    median delay in seconds of event time among them -- with the measured value and whether
    it is met; a kind the fleet did not inject is reported as not met, not as met."""
    report = evaluate_fleet(
        simulate(
            homes=2,
            vehicles=0,
            days=0.5,
            seed=11,
            anomalies_per_day=8.0,
            kinds=("drift",),
            mix={"door_sensor": 1, "leak_sensor": 1},
        )
    )
    drift = report["kinds"]["drift"]
    assert drift["windows"] >= 3 and drift["median_delay_s"] is not None, drift
    goals = check_goals(report)
    assert set(goals) == set(GOALS)
    assert goals["drift_median_delay_s"] == {
        "value": drift["median_delay_s"],
        "goal": 60.0,
        "met": drift["median_delay_s"] <= 60.0,
    }
    assert goals["recall"] == {
        "value": report["overall"]["recall"],
        "goal": 0.95,
        "met": report["overall"]["recall"] >= 0.95,
    }
    no_drift = {**report, "kinds": {k: v for k, v in report["kinds"].items() if k != "drift"}}
    assert check_goals(no_drift)["drift_median_delay_s"] == {"value": None, "goal": 60.0, "met": False}


def test_matching_rules() -> None:
    """Detection needs a plausible rule inside the window (+ grace); the rest are false or related."""
    fleet = simulate(homes=1, vehicles=0, days=0.3, seed=2, mix={"thermostat": 1})
    device = next(iter(fleet.devices))
    step = fleet.devices[device].interval_ms
    start = fleet.start_ms + 4 * 3600_000
    fleet.truth = [injection("spike", device, 480, 480, interval_ms=0, t0_ms=start, site="home-00000")]
    alerts = [
        RaisedAlert("a", device, "anomaly_score", 482, start + 2 * step),  # detects, 2 readings late
        RaisedAlert("b", device, "device_silent", 481, start + step),  # implausible: related
        RaisedAlert("c", device, "anomaly_score", 840, start + 3 * 3600_000),
    ]  # false alarm
    report = match(fleet, alerts, grace_readings=3, burn_in_s=3600.0)
    spike = report["kinds"]["spike"]
    assert (spike["detected"], spike["median_delay_readings"], spike["median_delay_s"]) == (1, 2.0, 2 * step / 1000)
    anomaly = report["rules"]["anomaly_score"]
    assert {k: anomaly[k] for k in ("alerts", "true", "related", "false", "precision")} == {
        "alerts": 2,
        "true": 1,
        "related": 0,
        "false": 1,
        "precision": 0.5,
    }
    assert anomaly["false_alarms_per_device_day"] == pytest.approx(1 / ((0.3 * 86400 - 3600) / 86400), rel=1e-3)
    assert set(anomaly["false_alarms_per_device_day_by_type"]) == {"thermostat"}
    assert report["rules"]["device_silent"]["related"] == 1
    late = match(fleet, alerts[:1], grace_readings=1, burn_in_s=3600.0)
    assert late["kinds"]["spike"]["detected"] == 0


def test_silence_timer_is_simulated() -> None:
    fleet = simulate(homes=1, vehicles=0, days=0.25, seed=3, mix={"smart_meter": 1})
    stream = next(iter(fleet.devices.values()))
    del stream.messages[100:110]  # 10 readings (300 s) missing
    alerts = run_alerts(fleet, settings_for({"silence_timeout_s": 90.0}))
    silent = [a for a in alerts if a.rule == "device_silent"]
    assert len(silent) == 1 and silent[0].raised_ms == stream.messages[99][0] + 90_000


def test_cli_simulated_json() -> None:
    result = CliRunner().invoke(
        cli,
        ["evaluate", "--simulated", "--homes", "1", "--vehicles", "0", "--days", "0.3", "--json"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert set(doc["configs"]) == {"defaults", "recommended"}
    assert doc["simulation"]["homes"] == 1 and doc["configs"]["defaults"]["overall"]["device_days"] > 0
    assert doc["goals"]["drift_median_delay_s"] == 60.0
    assert set(doc["configs"]["defaults"]["goals"]) == set(doc["goals"])

    from iotwatch.evaluation.cli import _render_simulated

    _render_simulated(doc)  # the rich tables render from the JSON document


def test_cli_simulated_detector_adds_a_configuration() -> None:
    """``--detector`` with ``--simulated``: the job's defaults with that per-metric detector,
    reported beside the defaults (the settings it ran with say so)."""
    result = CliRunner().invoke(
        cli,
        [
            "evaluate",
            "--simulated",
            "--homes",
            "1",
            "--vehicles",
            "0",
            "--days",
            "0.3",
            "--detector",
            "tail_ensemble",
            "--json",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert list(doc["configs"]) == ["defaults", "recommended", "device_detector=tail_ensemble"]
    ran = doc["configs"]["device_detector=tail_ensemble"]["settings"]
    assert ran["device_detector"] == "tail_ensemble"
    assert doc["configs"]["defaults"]["settings"]["device_detector"] == "declared_levels"
    assert doc["configs"]["device_detector=tail_ensemble"]["overall"] != doc["configs"]["defaults"]["overall"]

    from iotwatch.evaluation.cli import _render_simulated

    _render_simulated(doc)  # the added configuration renders too


def test_readings_a_late_fault_delays_raise_no_false_alarm() -> None:
    """The simulator's ``late`` fault holds readings back behind newer ones (within the allowed
    lateness): they are archived and go through the rules, but no alert is raised on them --
    fed to the detectors out of event-time order, a vehicle's coolant once looked like a jump."""
    fleet = simulate(
        homes=2,
        vehicles=3,
        days=0.25,
        seed=5,
        anomalies_per_day=0.0,
        faults=True,
        faults_per_day=400.0,
        fault_kinds=("late",),
    )
    out_of_order: set[tuple[str, int]] = set()
    newest: dict[str, int] = {}

    def note(device_id: str, row: dict) -> None:
        if row["kind"] == "reading":
            if row["seq"] < newest.get(device_id, -1):
                out_of_order.add((device_id, int(row["seq"])))
            newest[device_id] = max(newest.get(device_id, -1), int(row["seq"]))

    alerts = run_alerts(fleet, settings_for(), on_row=note)
    assert len(out_of_order) >= 50  # the fault did hold readings back, and they were kept
    assert not [a for a in alerts if (a.device_id, a.seq) in out_of_order], alerts
