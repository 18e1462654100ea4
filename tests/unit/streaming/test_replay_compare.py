"""``replay``'s comparison says why a rule's alerts differ from the live job's."""

from __future__ import annotations

from typing import Any

from iotwatch.streaming.replay_cli import compare, render_replay
from tests.support.alerts import make_alert


def test_alerts_only_the_live_job_raised_come_with_why(capsys: Any) -> None:
    silent = {
        a.alert_id: a
        for a in (make_alert(f"th-{n}", "thermostat", "h", "device_silent", "major", "raised", 1_000) for n in range(3))
    }
    spike = make_alert("m-1", "smart_meter", "h", "anomaly_score", "minor", "raised", 2_000)
    comparison = compare(silent, {spike.alert_id: spike})
    assert comparison["only_live"] == {"device_silent": 3} and comparison["only_replay"] == {"anomaly_score": 1}
    assert "timer" in comparison["why"]["device_silent"]
    assert "change of code" in comparison["why"]["anomaly_score"]

    render_replay({"tag": "v2", "totals": {"reading_records": 10}, "comparison": comparison})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "replay v2: 10 readings, alerts live 3 / replay 1 / same 0"
    assert lines[1].startswith("  only live: 3 device_silent -- the live job's timer raises it")
    assert lines[2].startswith("  only replay: 1 anomaly_score -- scored differently")
