"""The demo's closed-loop figures from an audit trail and alerts (no servers needed)."""

from __future__ import annotations

from pathlib import Path

from iotwatch.application.demo.closed_loop import summarise, timings
from iotwatch.application.demo.report import plot_closed_loop
from iotwatch.application.harness.results import as_json
from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.oncall import CommandAudit, CommandOutcome
from tests.helpers import injection
from tests.support.alerts import make_alert


def audit(command_id: str, alert_id: str, issued: int, *steps: tuple[str, int]) -> CommandAudit:
    record = CommandAudit(
        1,
        command_id,
        "p",
        alert_id,
        "water_leak",
        "d",
        "leak_sensor",
        "s",
        "close_valve",
        "responder",
        issued,
        issued + 60_000,
        1,
        CommandOutcome.SENT,
    )
    for status, at in steps:
        record = record.with_step(CommandOutcome(status), at)
    return record


def alert(alert_id: str, state: str, detected_at_ms: int) -> AlertRecord:
    return make_alert(
        "d", "leak_sensor", "s", "water_leak", "critical", state, 0, alert_id=alert_id, detected_at_ms=detected_at_ms
    )


def test_times_to_command_ack_and_recovery() -> None:
    alerts = [
        alert("a1", "raised", 1_000),
        alert("a1", "cleared", 9_000),
        alert("a2", "raised", 2_000),
    ]
    trail = [
        audit("c1", "a1", 1_500, ("sent", 1_500)),  # superseded by its later record
        audit("c1", "a1", 1_500, ("sent", 1_500), ("accepted", 1_700), ("done", 1_800)),
        audit("c2", "a2", 4_000, ("sent", 4_000), ("timed_out", 64_000)),
    ]
    leak = injection("water_leak", "leak", 0, 0, device_type="leak_sensor", ended_by_command="c1")
    spike = injection("spike", "leak", 5, 5, device_type="leak_sensor")
    result = as_json(summarise(trail, alerts, [leak, spike]))  # the summary's keys
    assert result["commands"] == 2 and result["outcomes"] == {"done": 1, "timed_out": 1}
    assert result["time_to_command_s"]["n"] == 2 and result["time_to_command_s"]["p50"] == 1.25  # 0.5 s and 2 s
    assert result["time_to_device_ack_s"] == {"p50": 0.2, "p99": 0.2, "n": 1}
    assert result["time_to_recovery_s"] == {"p50": 7.5, "p99": 7.5, "n": 1}  # sent at 1.5 s, cleared at 9 s
    assert result["anomalies_ended_by_command"] == 1
    assert as_json(summarise([], [], []))["time_to_recovery_s"] == {"p50": None, "p99": None, "n": 0}


def test_the_closed_loop_plot(tmp_path: Path) -> None:
    alerts = [
        alert("a1", "raised", 1_000),
        alert("a1", "cleared", 9_000),
    ]
    trail = [audit("c1", "a1", 1_500, ("sent", 1_500), ("accepted", 1_700), ("done", 1_800))]
    _, found = timings(trail, alerts)
    assert found == {"time_to_command": [500], "time_to_device_ack": [200], "time_to_recovery": [7_500]}
    path = plot_closed_loop(tmp_path, found)
    assert path is not None and path.stat().st_size > 1000
    assert plot_closed_loop(tmp_path, timings([], [])[1]) is None
