"""The one evaluator of alerts against the ground truth (``evaluate --simulated`` and the demo)."""

from __future__ import annotations

import msgspec
import pytest

from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.detection import RULES_FOR_ANOMALY_KIND
from iotwatch.contract.ground_truth import ANOMALY, TRANSPORT, Injection, decode_injection, encode_injection
from iotwatch.devices.anomaly_kinds import KINDS
from iotwatch.evaluation.judgement import END_OF_RUN, FALSE_ALARM, RELATED, TRUE, JudgedRun, RaisedAlert, judge
from tests.helpers import injection

T0 = 1_700_000_000_000
TYPES = {"t1": "thermostat", "t2": "thermostat", "car": "vehicle_edr"}
RUN = JudgedRun(device_types=TYPES, intervals_ms={"t1": 1000, "t2": 1000, "car": 100})


def injected(kind: str, device: str, start_seq: int, end_seq: int, category: str = ANOMALY) -> Injection:
    return injection(
        kind,
        device,
        start_seq,
        end_seq,
        device_type=TYPES[device],
        interval_ms=RUN.intervals_ms[device],
        t0_ms=T0,
        category=category,
    )


def raised(alert_id: str, device: str, rule: str, seq: int, raised_ms: int | None = None) -> RaisedAlert:
    step = RUN.intervals_ms[device]
    return RaisedAlert(alert_id, device, rule, seq, T0 + seq * step if raised_ms is None else raised_ms)


def test_each_alert_is_a_detection_related_a_false_alarm_or_the_end_of_the_run() -> None:
    truth = [
        injected("level_shift", "t1", 100, 200),
        injected("dropout", "t2", 300, 350),
        injected("crash", "car", 5000, 5600),
        injected("clock_skew", "t1", 400, 420, TRANSPORT),
    ]
    alerts = [
        raised("shift", "t1", "anomaly_score", 104),  # 4 readings into the shift
        raised("again", "t1", "anomaly_score", 150),  # a second detection of the same shift
        raised("silence", "t2", "device_silent", 299, T0 + 330_000),  # newest reading before the dropout
        raised("crash", "car", "crash", 5000),
        raised("braking", "car", "harsh_braking", 5001),  # in the crash, but harsh braking does not detect a crash
        raised("after", "t1", "anomaly_score", 260),  # the shift's aftermath (as long again as the shift)
        raised("stray", "t1", "anomaly_score", 600),  # nothing injected there
        raised("stopped", "t1", "device_silent", 899),  # t1's newest reading: the simulators stopped
        raised("stall", "t2", "device_silent", 700),  # silent mid-run, no dropout
    ]
    ends = JudgedRun(RUN.device_types, RUN.intervals_ms, last_seq={"t1": 899, "t2": 899, "car": 8999})
    result = judge(truth, alerts, ends)
    assert result.verdicts == {
        "shift": TRUE,
        "again": TRUE,
        "silence": TRUE,
        "crash": TRUE,
        "braking": RELATED,
        "after": RELATED,
        "stray": FALSE_ALARM,
        "stopped": END_OF_RUN,
        "stall": FALSE_ALARM,
    }
    overall = result.report["overall"]
    assert (overall["windows"], overall["detected"], overall["recall"]) == (3, 3, 1.0)
    assert (overall["alerts"], overall["true"], overall["related"], overall["end_of_run"]) == (9, 4, 2, 1)
    assert overall["precision"] == round(4 / 6, 4) and overall["false_alarms"] == 2
    assert overall["false_alarms_by_rule"] == {"anomaly_score": 1, "device_silent": 1}
    kinds = result.report["kinds"]
    assert kinds["level_shift"]["median_delay_readings"] == 4.0 and kinds["level_shift"]["median_delay_s"] == 4.0
    assert kinds["dropout"]["median_delay_s"] == 30.0  # from the first missing reading to the silence alert
    assert result.report["transport_faults"] == {"clock_skew": 1}
    assert overall["device_days"] is None and overall["false_alarms_per_device_day"] is None  # no span given
    # Without the run's ends, a silence after the newest reading is a false alarm like any other.
    assert judge(truth, alerts, RUN).verdicts["stopped"] == FALSE_ALARM


def test_alerts_are_placed_by_seq_so_a_skewed_clock_moves_no_verdict() -> None:
    """A clock-skew fault moves a device's event times (an hour here), not its seqs."""
    truth = [injected("spike", "t1", 100, 100)]
    skewed = [raised("spike", "t1", "anomaly_score", 100, T0 + 100_000 + 3_600_000)]
    assert judge(truth, skewed, RUN).verdicts == {"spike": TRUE}


def test_grace_readings_after_the_end_still_detect() -> None:
    truth = [injected("spike", "t1", 100, 100)]
    late = [raised("late", "t1", "anomaly_score", 103)]
    assert judge(truth, late, RUN, grace_readings=3).verdicts == {"late": TRUE}
    assert judge(truth, late, RUN, grace_readings=2).verdicts == {"late": RELATED}  # the aftermath


def test_the_burn_in_leaves_early_alerts_and_anomalies_out() -> None:
    truth = [injected("spike", "t1", 10, 10), injected("spike", "t1", 5000, 5000)]
    alerts = [raised("early", "t1", "anomaly_score", 10), raised("later", "t1", "anomaly_score", 5000)]
    run = JudgedRun(RUN.device_types, RUN.intervals_ms, start_ms=T0, end_ms=T0 + 86_400_000)
    result = judge(truth, alerts, run, burn_in_s=3600.0)
    assert result.verdicts == {"later": TRUE} and result.report["overall"]["windows"] == 1
    assert result.report["overall"]["device_days"] == pytest.approx(3 * 23 / 24, abs=0.01)


def test_one_table_says_which_rules_detect_each_injected_kind() -> None:
    """A drifting temperature sensor on a cooling thermostat: the HVAC keeps cooling on the
    true temperature while the reported one falls past the setpoint, and ``stuck_hvac``
    fires. That detects the drift (the demo called it a false alarm while it had its own table)."""
    assert set(RULES_FOR_ANOMALY_KIND) == {name for name, kind in KINDS.items() if kind.category == ANOMALY}
    result = judge([injected("drift", "t1", 186, 510)], [raised("hvac", "t1", "stuck_hvac", 247)], RUN)
    assert result.verdicts == {"hvac": TRUE} and result.report["overall"]["recall"] == 1.0


def test_an_alert_record_is_judged_at_its_raising_reading() -> None:
    """A record raises at ``seq`` (an episode may have begun earlier, at ``first_seq``) on its
    reading's event time; a silence is noticed in processing time."""
    fields = {
        "alert_id": "a",
        "state": "raised",
        "severity": "major",
        "detector": "rule",
        "device_id": "t1",
        "device_type": "thermostat",
        "site": "h",
        "score": 1.0,
        "first_event_ms": T0,
        "detected_at_ms": T0 + 9_000,
        "message": "m",
    }
    record = msgspec.convert(
        {**fields, "rule": "anomaly_score", "first_seq": 3, "seq": 5, "last_event_ms": T0 + 5_000}, AlertRecord
    )
    assert RaisedAlert.of_record(record) == RaisedAlert("a", "t1", "anomaly_score", 5, T0 + 5_000)
    silent = msgspec.convert({**fields, "rule": "device_silent", "seq": 7, "last_event_ms": T0 + 7_000}, AlertRecord)
    assert RaisedAlert.of_record(silent).raised_ms == T0 + 9_000


def test_a_kind_this_version_does_not_know_is_judged_without_failing() -> None:
    """A newer simulator's kind: no rule detects it, so an alert inside it is related."""
    alerts = [raised("inside", "t1", "anomaly_score", 105)]
    result = judge([injected("gremlin", "t1", 100, 120)], alerts, RUN)
    assert result.verdicts == {"inside": RELATED}
    assert result.report["kinds"]["gremlin"]["recall"] == 0.0


def test_an_earlier_spelling_of_a_kind_reads_as_its_one_spelling() -> None:
    line = encode_injection(injected("water_leak", "t1", 1, 2)).replace(b'"water_leak"', b'"leak"')
    assert decode_injection(line).kind == "water_leak"
