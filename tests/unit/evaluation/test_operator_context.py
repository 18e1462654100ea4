"""An operator's setpoint change is context for the stuck-HVAC rule, a stuck HVAC is a fault:
a simulated home through the job's per-device engine (no servers), judged by its ground truth."""

from __future__ import annotations

from pathlib import Path

from iotwatch.contract.ground_truth import OPERATOR, SETPOINT_CHANGE
from iotwatch.devices.config import SimConfig
from iotwatch.devices.simulation import Simulation
from iotwatch.evaluation.simulated import START_MS, match, run_alerts, run_fleet, settings_for

HOUR_MS = 3_600_000
THERMOSTAT = "home-00002-thermostat-0"


def _home(scenario: Path | None = None) -> Simulation:
    """Three homes with one thermostat each, a reading every 30 s."""
    config = SimConfig(
        seed=7,
        homes=3,
        vehicles=0,
        rate=1 / 30,
        start_ms=START_MS,
        tick_ms=5000,
        mix={"thermostat": 1},
        scenario=scenario,
    )
    return Simulation(config)


def test_an_operators_setpoint_change_raises_no_alert_and_the_ground_truth_says_it_was_expected() -> None:
    """``devices set home-00002-thermostat-0 setpoint_c=27.5``: the room is over 5 C below its new
    setpoint and the HVAC works toward it for hours; that settling is not a stuck HVAC."""
    fleet = run_fleet(_home(), {}, 0.5, [(START_MS + 4 * HOUR_MS, THERMOSTAT, 27.5)])
    changes = [e for e in fleet.truth if e.category == OPERATOR]
    assert [(e.device_id, e.kind, e.params["to_c"]) for e in changes] == [(THERMOSTAT, SETPOINT_CHANGE, 27.5)]
    assert changes[0].end_ts - changes[0].start_ts > 10 * 60_000  # degrees at a few degrees an hour

    settings = settings_for()
    assert [a for a in run_alerts(fleet, settings) if a.device_id == THERMOSTAT] == []
    report = match(fleet, run_alerts(fleet, settings), burn_in_s=0)
    assert report["operator_actions"] == {"actions": {SETPOINT_CHANGE: 1}, "alerted": 0, "alerted_by_rule": {}}
    # without the settling the gap sizes, the same change is reported as a stuck HVAC
    hasty = settings_for({"stuck_hvac_settle_c_per_h": 1e9})
    assert match(fleet, run_alerts(fleet, hasty), burn_in_s=0)["operator_actions"]["alerted_by_rule"] == {
        "stuck_hvac": 1
    }


def test_a_stuck_hvac_injected_for_300_s_raises_stuck_hvac_on_every_thermostat(tmp_path: Path) -> None:
    """A stuck relay while the household's setback holds the room 3 C from the setpoint: the
    HVAC pushes past it at once, in heating and in cooling homes alike (the reading's
    ``hvac_cooling`` says which; the outside temperature of a cooling home's night does not)."""
    scenario = tmp_path / "stuck.toml"
    scenario.write_text('[[anomalies]]\nkind = "stuck_hvac"\ndevices = "*thermostat*"\nat_s = 600\nduration_s = 300\n')
    fleet = run_fleet(_home(scenario), {}, 0.1)
    report = match(fleet, run_alerts(fleet, settings_for()), burn_in_s=0)
    assert report["kinds"]["stuck_hvac"]["windows"] == 3
    assert report["kinds"]["stuck_hvac"]["detected"] == 3, report["kinds"]["stuck_hvac"]
    assert report["overall"]["false_alarms"] == 0
