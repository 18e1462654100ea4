"""``iotwatch evaluate --readings --truth``: detectors over a simulator run's readings,
labelled by its ground truth (the contract's record)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from iotwatch.application.cli import cli
from iotwatch.contract.ground_truth import read_ground_truth, write_ground_truth
from iotwatch.devices.config import SimConfig
from iotwatch.devices.simulation import STATUS, Simulation
from iotwatch.errors import IotwatchError
from tests.support.devices import START_MS


def _simulator_run(tmp_path: Path) -> tuple[Path, Path]:
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "anomalies": [
                    {"kind": "spike", "devices": "home-00000-thermostat-0", "at_s": 300, "magnitude": 9.0},
                    {
                        "kind": "level_shift",
                        "devices": "home-00000-smart_meter-0",
                        "at_s": 400,
                        "duration_s": 60,
                        "magnitude": 800,
                    },
                ]
            }
        )
    )
    config = SimConfig(
        seed=3, homes=1, vehicles=0, start_ms=START_MS, mix={"thermostat": 1, "smart_meter": 1}, scenario=plan
    )
    sim = Simulation(config)
    readings = tmp_path / "readings.jsonl"
    with readings.open("w") as out:
        for batch in sim.run(600):
            for _uid, _topic, payload, group in batch:
                if group != STATUS:
                    out.write((payload if isinstance(payload, str) else payload.decode()) + "\n")
    truth = tmp_path / "truth.jsonl"
    write_ground_truth(truth, sim.injector.records)
    return readings, truth


def test_detectors_are_evaluated_on_a_simulator_run(tmp_path: Path) -> None:
    readings, truth = _simulator_run(tmp_path)
    assert {t.kind for t in read_ground_truth(truth)} == {"spike", "level_shift"}
    args = ["evaluate", "--readings", str(readings), "--truth", str(truth), "--detector", "tail_ensemble", "--json"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)["detectors"]["tail_ensemble"]["overall"]
    assert report["windows"] >= 2 and report["detected_windows"] >= 1, report


def test_a_ground_truth_line_that_is_no_injection_is_named(tmp_path: Path) -> None:
    readings, truth = _simulator_run(tmp_path)
    lines = truth.read_text().splitlines()
    truth.write_text("\n".join([lines[0], json.dumps({"device_id": "x", "kind": "spike"}), *lines[1:]]) + "\n")
    args = ["evaluate", "--readings", str(readings), "--truth", str(truth), "--detector", "tail_ensemble"]
    result = CliRunner().invoke(cli, args)
    assert isinstance(result.exception, IotwatchError), result.output
    assert f"{truth}:2: not a ground-truth record: Object missing required field" in str(result.exception)
