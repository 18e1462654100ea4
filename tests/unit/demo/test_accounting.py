"""The demo's judgement of its alerts and its pick of the device the dashboards are checked on
(no servers: constructed alerts and readings)."""

from __future__ import annotations

from typing import Any

import msgspec

from iotwatch.contract.alerts import AlertRecord
from iotwatch.demo.accounting import RawIndex, judge_alerts
from iotwatch.demo.runner import pick_values
from iotwatch.evaluation.judgement import END_OF_RUN, FALSE_ALARM, RELATED, TRUE
from tests.helpers import injection


def alert(alert_id: str, device: str, rule: str, first_seq: int, seq: int | None = None, **fields: Any) -> AlertRecord:
    return msgspec.convert(
        {
            "alert_id": alert_id,
            "state": "raised",
            "severity": "major",
            "detector": "rule",
            "device_id": device,
            "device_type": "thermostat",
            "site": "h",
            "rule": rule,
            "score": 1.0,
            "first_seq": first_seq,
            "seq": first_seq if seq is None else seq,
            "first_event_ms": 1_700_000_000_000 + first_seq * 1000,
            "detected_at_ms": 1_700_000_000_000 + first_seq * 1000,
            "message": rule,
            **fields,
        },
        AlertRecord,
    )


def test_the_demo_reports_the_one_judgement_and_the_end_of_the_run() -> None:
    """The demo judges by :func:`iotwatch.evaluation.judgement.judge`; its summary adds up and
    every device's silence when the simulators stop is the end of the run."""
    raw = RawIndex(identities={"t1": ("thermostat", "h"), "t2": ("thermostat", "h")})
    raw.seqs["t1"].update(range(900))
    raw.seqs["t2"].update(set(range(900)) - set(range(300, 351)))
    truth = [injection("dropout", "t2", 300, 350)]
    alerts = [
        alert("silence", "t2", "device_silent", 299),
        alert("stray", "t1", "anomaly_score", 600),
        alert("stopped", "t1", "device_silent", 899),
        alert("silence", "t2", "device_silent", 299, state="cleared"),
        # the responder's escalation has no reading of its own: it is judged at its original's
        msgspec.structs.replace(
            alert("escalated", "t2", "command_escalation", 0, caused_by="silence"), seq=None, first_seq=None
        ),
    ]
    summary, verdicts = judge_alerts(alerts, truth, raw, speedup=10.0)
    assert verdicts == {"silence": TRUE, "stray": FALSE_ALARM, "stopped": END_OF_RUN, "escalated": RELATED}
    assert (summary["recall"], summary["precision"], summary["alerts_raised"]) == (1.0, 0.5, 4)
    assert (summary["alerts_detecting_an_anomaly"], summary["false_alarms"], summary["end_of_run_silences"]) == (
        1,
        1,
        1,
    )
    assert summary["by_kind"]["dropout"] == {"injected": 1, "detected": 1, "recall": 1.0, "median_delay_s": None}


def test_dashboards_are_checked_on_a_device_that_was_sent_a_command() -> None:
    """The device dashboard annotates commands: the demo checks it on a device that had one
    (so that query can return data), else on one whose alert matched an injected anomaly."""
    identities = {"h-door": ("door_sensor", "h"), "h-leak": ("leak_sensor", "h"), "car": ("vehicle_edr", "road")}
    alerts = [
        alert("door", "h-door", "anomaly_score", 10, metric="temperature_c"),
        alert("leak", "h-leak", "water_leak", 20, metric="water_detected"),
    ]
    verdicts = {"door": TRUE, "leak": TRUE}
    picked = pick_values(alerts, verdicts, identities, frozenset({"h-leak", "car"}))
    assert picked is not None and (picked.device, picked.metric, picked.vehicles) == (
        "h-leak",
        "water_detected",
        ["car"],
    )
    picked = pick_values(alerts, {"door": TRUE, "leak": FALSE_ALARM}, identities)
    assert picked is not None and (picked.device, picked.site) == ("h-door", "h")
