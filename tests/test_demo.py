"""`iotwatch demo`: the README's main command, end to end on the embedded stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_demo_runs_every_stage_loses_nothing_and_writes_the_report(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOTWATCH_")}
    result = subprocess.run([sys.executable, "-m", "iotwatch", "demo", "--duration", "30", "--homes", "3",
                             "--vehicles", "1", "--out", str(tmp_path / "run"), "--json"],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["completed"] is True
    assert summary["loss"]["loss"] == 0
    messages = summary["messages"]
    assert messages["gateway_received"] == messages["simulated"] > 0
    assert messages["stream"]["reading_records"] + messages["stream"]["late"] == summary["loss"]["unique_readings_in_kafka"]
    assert summary["alerts"]["recall"] is not None and summary["alerts"]["anomalies_injected"] > 0
    report = Path(summary["report"]["folder"])
    assert (report / "summary.json").exists() and (report / "stage_rates.png").exists()
    assert any(p.name.startswith("device_") for p in report.glob("*.png"))
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path / "run")], capture_output=True, text=True).stdout
    assert not leftovers.strip(), "the demo left processes running"
