"""`iotwatch chaos`, short: every fault of the schedule once under load, on the real
processes (mosquitto, Apache Kafka, influxd, Spark local, the iotwatch components), and
every proof from the data holds."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from iotwatch.application.chaos.schedule import FAULT_KINDS
from tests.helpers import user_env

pytestmark = pytest.mark.slow


#: Longest the run may take on a loaded machine; then it is stopped as Ctrl-C stops it (it
#: stops everything it started) and the test fails.
RUN_TIMEOUT_S = 1500


def _log_tails(run: Path, lines: int = 15) -> str:
    """The last lines of every component's log in the run folder (what a failed run's
    report needs once the temporary folder is gone)."""
    parts = []
    for log in sorted(run.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"\n--- {log.name} ---\n" + "\n".join(line[:300] for line in tail))
    return "".join(parts)


@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_every_component_killed_once_under_load_loses_nothing_and_recovers(tmp_path: Path) -> None:
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "iotwatch.application", "chaos", "--duration", "120", "--rate", "300", "--homes", "10"]
        + ["--spacing", "8", "--lead", "15", "--seed", "3", "--out", str(run), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=user_env(tmp_path),
    )
    try:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=240)
        pytest.fail(f"iotwatch chaos took more than {RUN_TIMEOUT_S} s: {stderr[-3000:]}")
    summary = json.loads(stdout[stdout.index("{") :]) if "{" in stdout else {}
    assert summary, stderr[-3000:]
    proofs = ("loss", "alerts", "notifications", "commands", "recovery", "lag")
    failed = {k: summary[k] for k in proofs if not summary[k]["ok"]}
    assert not failed, json.dumps(failed, indent=1)[:3000] + _log_tails(run)
    assert not summary["unplanned_exits"], summary["unplanned_exits"]
    assert process.returncode == 0 and summary["ok"], (summary["drained"], summary["resources"]["ok"])
    assert summary["lag"]["level"] == 300 * 10  # 10 s of input

    # each fault once, each recovered with its time; each component started again
    faults = summary["faults"]
    assert sorted(f["fault"] for f in faults) == sorted(kind.name for kind in FAULT_KINDS)
    assert all(f["recovery_s"] is not None and f["recovery_s"] >= f["down_s"] >= 0 for f in faults), faults
    assert all(f["lag_at_recovery"] is not None for f in faults), faults
    interrupted = next(f for f in faults if f["fault"] == "stream ctrl-c")
    assert interrupted["exit_status"] == 0  # Ctrl-C: a clean stop, then a plain restart resumes
    assert all(n >= 1 for n in summary["recovery"]["restarted"].values()), summary["recovery"]["restarted"]

    loss = summary["loss"]
    assert loss["loss"] == 0 and loss["unique_readings_in_kafka"] > 100 * 120 == 12_000
    assert loss["archived"] + loss["late"] >= loss["unique_readings_in_kafka"]
    alerts = summary["alerts"]
    assert alerts["live"] == alerts["replay"] == alerts["same"] > 0
    notes = summary["notifications"]
    assert notes["unique_after_dedup"] >= notes["alert_records"] >= alerts["live"]

    # resources sampled for every process through the run, and the report written
    processes = summary["resources"]["processes"]
    assert set(processes) >= {"gateway", "stream", "respond", "forward", "mqtt", "kafka", "influx", "simulate"}
    assert all(p["samples"] >= 10 and p["rss_bytes"]["peak"] > 0 for p in processes.values())
    assert processes["stream"]["incarnations"] == 3  # started, Ctrl-C'd and killed: three processes
    report = run / "report"
    assert json.loads((report / "summary.json").read_text())["ok"] is True
    for plot in ("pipeline.png", "latency.png", "resources.png"):
        assert (report / plot).stat().st_size > 10_000, plot

    # nothing left running from the run folder
    left = [p.info for p in psutil.process_iter(["pid", "cmdline"]) if str(run) in " ".join(p.info["cmdline"] or [])]
    assert not left, left
