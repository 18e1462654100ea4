"""The usual mistakes of a new user: each is one line on stderr and a non-zero exit.

Run as a user runs the commands (a subprocess, the default log level), with HOME in a
temporary folder so nothing of the developer's own state is read or written.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import user_env

MISTAKES: dict[str, tuple[list[str], list[str], list[str]]] = {
    # id: (argv, words the line must hold, words it must not)
    "anomaly the fleet cannot produce": (
        ["simulate", "--anomalies", "crash", "--anomaly-rate", "2", "--vehicles", "0", "--duration", "600"],
        ["--anomalies", "'crash'", "vehicle_edr", "fleet has none"],
        [],
    ),
    "fault given as an anomaly": (
        ["simulate", "--anomalies", "duplicate", "--anomaly-rate", "2", "--duration", "600"],
        ["'duplicate' is a transport fault", "--faults", "spike"],
        ["out_of_order"],
    ),
    "anomaly given as a fault": (
        ["simulate", "--faults", "spike", "--fault-rate", "2", "--duration", "600"],
        ["'spike' is an anomaly", "--anomalies", "clock_skew"],
        ["level_shift"],
    ),
    "unknown fault lists only faults": (
        ["simulate", "--faults", "telepathy", "--fault-rate", "2", "--duration", "600"],
        ["unknown transport fault kind 'telepathy'", "clock_skew, duplicate, late, malformed, out_of_order"],
        ["spike", "crash"],
    ),
    "unknown anomaly lists only anomalies": (
        ["simulate", "--anomalies", "gremlins", "--anomaly-rate", "2", "--duration", "600"],
        ["unknown anomaly kind 'gremlins'", "spike"],
        ["clock_skew", "malformed"],
    ),
    "kinds without the rate that draws them": (
        ["simulate", "--anomalies", "spike", "--duration", "600"],
        ["--anomalies has no effect without --anomaly-rate"],
        [],
    ),
    "anomalies that would start after the run ends": (
        ["simulate", "--anomaly-rate", "5", "--anomalies-after", "1000", "--duration", "5"],
        ["--anomalies-after 1000", "--duration 5", "no anomaly would be injected"],
        [],
    ),
    "a warm-up for anomalies that are not drawn": (
        ["simulate", "--anomalies-after", "60", "--duration", "600"],
        ["--anomalies-after has no effect without --anomaly-rate"],
        [],
    ),
    "a stream that would run no batch": (["stream", "--duration", "0"], ["--duration", "0"], []),
    "a negative trigger interval": (["stream", "--trigger", "-1"], ["--trigger", "-1"], []),
    "a twin setpoint that is not a number": (
        ["devices", "set", "home-1-thermostat-0", "setpoint_c=banana"],
        ["'setpoint_c=banana'", "a number of degrees Celsius"],
        ["Expected", "$."],
    ),
    "a valve that is neither open nor closed": (
        ["devices", "set", "home-1-leak_sensor-0", "valve=ajar"],
        ["'valve=ajar'", "open or closed"],
        [],
    ),
    "a tail that starts twice": (
        ["alerts", "tail", "--since", "1h", "--from-beginning", "--kafka", "127.0.0.1:1"],
        ["--since", "--from-beginning"],
        [],
    ),
    "a tail that would stop before it starts": (
        ["alerts", "tail", "--timeout", "0", "--kafka", "127.0.0.1:1"],
        ["--timeout", "0"],
        [],
    ),
    "Kafka port out of range": (["alerts", "tail", "--kafka", "localhost:99999"], ["--kafka", "99999", "1-65535"], []),
    "Kafka port out of range (stream)": (["stream", "--kafka", "localhost:99999"], ["--kafka", "99999"], []),
    "MQTT port out of range": (["gateway", "--mqtt", "mqtt://localhost:70000"], ["--mqtt", "70000"], []),
    "InfluxDB port out of range": (["stream", "--influx", "http://localhost:123456"], ["--influx", "123456"], []),
    "Kafka that does not answer": (
        ["alerts", "tail", "--kafka", "127.0.0.1:1", "--timeout", "1"],
        ["Kafka at 127.0.0.1:1 did not answer"],
        ["FAIL", "%3|"],
    ),
    "a settings file that is not there": (
        ["--config", "no-such-file.toml", "stack", "status"],
        ["settings file no-such-file.toml (--config) does not exist"],
        ["internal error"],
    ),
    "MQTT broker that does not answer": (
        ["simulate", "--mqtt", "mqtt://127.0.0.1:1", "--duration", "1"],
        ["mqtt://127.0.0.1:1", "refused"],
        [],
    ),
}


def run_iotwatch(
    argv: list[str], home: Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iotwatch.application", *argv],
        env={**user_env(home), **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_mistake_is_one_line_on_stderr_and_a_non_zero_exit(mistake: str, tmp_path: Path) -> None:
    argv, present, absent = MISTAKES[mistake]
    result = run_iotwatch(argv, tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0, result
    assert len(lines) == 1 and lines[0].startswith("iotwatch: error: "), result.stderr
    for word in present:
        assert word in lines[0], lines[0]
    for word in absent:
        assert word not in lines[0], lines[0]
    assert not list(tmp_path.rglob("seq-*.json")), "a refused run must not write simulator state"


def test_score_csv_names_the_row_that_is_not_a_number(tmp_path: Path) -> None:
    rows = [
        "timestamp,value",
        "2024-01-01 00:00:00,1.0",
        "2024-01-01 00:05:00,2.0",
        "2024-01-01 00:07:00,3.0",
        "2024-01-01 00:10:00,n/a",
    ]
    source = tmp_path / "in.csv"
    source.write_text("\n".join(rows) + "\n")
    result = run_iotwatch(["score-csv", str(source), str(tmp_path / "out.csv")], tmp_path)
    assert result.returncode != 0 and result.stderr.count("\n") == 1, result.stderr
    assert "row 4: value 'n/a' is not a finite number" in result.stderr


def test_log_level_debug_brings_the_libraries_detail_back(tmp_path: Path) -> None:
    result = run_iotwatch(
        ["--log-level", "debug", "alerts", "tail", "--kafka", "127.0.0.1:1", "--timeout", "1"], tmp_path
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and lines[-1].startswith("iotwatch: error: Kafka at 127.0.0.1:1 did not answer")
    assert sum(" DEBUG iotwatch.librdkafka: FAIL " in line for line in lines) >= 2, result.stderr


def test_a_setting_that_does_not_validate_names_its_variable(tmp_path: Path) -> None:
    result = run_iotwatch(["stack", "status"], tmp_path, env={"IOTWATCH_STREAM_ALERT_FIRE_SCORE": "7"})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("iotwatch: error: invalid settings: IOTWATCH_STREAM_ALERT_FIRE_SCORE: "), lines
    assert "less than or equal to 1" in lines[0] and "'7'" in lines[0]


def test_the_alert_commands_read_the_alerts_table_of_the_config_file(tmp_path: Path) -> None:
    """``--config``'s ``[alerts]`` reaches ``alerts forward``: its webhook is checked (and refused
    here, before Kafka is asked), not reported missing."""
    config = tmp_path / "iotwatch.toml"
    config.write_text('[alerts]\nwebhook_url = "ftp://receiver.example/hook"\n')
    result = run_iotwatch(["--config", str(config), "alerts", "forward", "--kafka", "127.0.0.1:1"], tmp_path)
    assert result.returncode != 0 and "'ftp://receiver.example/hook' is not an http(s) URL" in result.stderr, result


def test_a_bug_is_an_internal_error_with_its_traceback_under_debug(tmp_path: Path) -> None:
    """Not a user's mistake: said so, and the traceback is one flag away (a ValueError from
    the code is a bug, not an invalid option). A command that fails as a bug would, added to
    the real command line in a process of its own."""
    program = (
        "import sys, click\n"
        "from iotwatch.application.cli import cli, main\n"
        "@cli.command('explode')\n"
        "def explode():\n"
        "    raise ValueError('an index went wrong')\n"
        "main(sys.argv[1:])\n"
    )
    for argv, traceback_shown in ((["explode"], False), (["--log-level", "debug", "explode"], True)):
        result = subprocess.run(
            [sys.executable, "-c", program, *argv], env=user_env(tmp_path), capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 1, result
        assert "iotwatch: internal error: ValueError: an index went wrong" in result.stderr, result.stderr
        assert ("Traceback (most recent call last)" in result.stderr) == traceback_shown, result.stderr
