"""``iotwatch alerts tail`` against the real broker: JSON lines, filters, limits, committed offsets."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner

from iotwatch.cli import cli
from iotwatch.contract.alerts import AlertRecord, decode_alert, encode_alert
from iotwatch.settings import Settings
from tests.alerts.conftest import alert_run, produce


def run_tail(settings: Settings, *args: str) -> Any:
    argv = ["alerts", "tail", "--kafka", settings.kafka.bootstrap_servers, *args]
    result = CliRunner().invoke(
        cli,
        argv,
        env={"IOTWATCH_TOPIC_ALERTS": settings.topics.alerts, "IOTWATCH_ALERTS_SESSION_TIMEOUT_MS": "6000"},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    return result


def lines(output: str) -> list[AlertRecord]:
    return [decode_alert(line.encode()) for line in output.splitlines() if line.startswith("{")]


def test_tail_json_from_beginning_limit_filters_and_resume(test_settings: Settings, unique: str) -> None:
    records = alert_run(10)  # 10 raised, then their 10 clears
    produce(test_settings.kafka, test_settings.topics.alerts, [*records, b"not an alert"])
    group = f"tail-{unique}"

    first = lines(
        run_tail(
            test_settings, "--group", group, "--from-beginning", "--json", "--limit", "7", "--timeout", "40"
        ).output
    )
    assert len(first) == 7 and all(a in records for a in first)

    # same group: resumes after what was shown (per-partition order), never repeats it; --from-beginning
    # only affects partitions the group has no offset for
    rest = lines(
        run_tail(
            test_settings, "--group", group, "--from-beginning", "--json", "--limit", "13", "--timeout", "30"
        ).output
    )
    assert sorted(map(encode_alert, first + rest)) == sorted(map(encode_alert, records))

    # filters, in a fresh group
    expected = [r for r in records if r.severity in ("critical", "major") and r.site in ("home-1", "home-2")]
    major_home = lines(
        run_tail(
            test_settings,
            "--group",
            f"{group}-f",
            "--from-beginning",
            "--json",
            "--severity",
            "major",
            "--site",
            "home-1",
            "--site",
            "home-2",
            "--limit",
            str(len(expected)),
            "--timeout",
            "30",
        ).output
    )
    assert expected and sorted(map(encode_alert, major_home)) == sorted(map(encode_alert, expected))

    wanted = [
        r
        for r in records
        if r.rule in ("crash", "anomaly_score") and r.device_type == "vehicle_edr" and r.state == "cleared"
    ]
    assert len(wanted) == 2
    picked = lines(
        run_tail(
            test_settings,
            "--group",
            f"{group}-r",
            "--from-beginning",
            "--json",
            "--rule",
            "crash",
            "--rule",
            "anomaly_score",
            "--device-type",
            "vehicle_edr",
            "--state",
            "cleared",
            "--limit",
            "2",
            "--timeout",
            "30",
        ).output
    )
    assert sorted(map(encode_alert, picked)) == sorted(map(encode_alert, wanted))


def test_tail_plain_lines(test_settings: Settings, unique: str) -> None:
    records = alert_run(3)
    produce(test_settings.kafka, test_settings.topics.alerts, records)
    result = run_tail(
        test_settings, "--group", f"plain-{unique}", "--from-beginning", "--plain", "--limit", "6", "--timeout", "40"
    )
    out = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(out) == 6, result.output
    assert any("CRITICAL raised" in line and "car-1" in line and "fleet-2" in line for line in out)
    detected = {r.detected_at for r in records}  # each line starts with the clock time of detection
    assert all(line.split(" ", 1)[0] in detected for line in out), out
    assert "6 shown" in result.stderr
