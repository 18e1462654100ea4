"""``iotwatch alerts tail`` against the real broker: JSON lines, filters, limits, committed offsets."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

from click.testing import CliRunner
from confluent_kafka import Producer

from iotwatch.application.cli import cli
from iotwatch.clients.kafka import ensure_topics
from iotwatch.contract.alerts import AlertRecord, alert_message, decode_alert, encode_alert
from iotwatch.settings import Settings
from tests.helpers import user_env
from tests.support.alerts import alert_run, produce


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


def _tail_process(settings: Settings, *args: str) -> subprocess.Popen[str]:
    """``iotwatch alerts tail`` in its own process group (as a terminal runs it)."""
    env = user_env()
    env["IOTWATCH_TOPIC_ALERTS"] = settings.topics.alerts
    command = [
        sys.executable,
        "-m",
        "iotwatch.application",
        "alerts",
        "tail",
        "--kafka",
        settings.kafka.bootstrap_servers,
        *args,
    ]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _wait_for_line(process: subprocess.Popen[str], text: str, timeout_s: float) -> list[str]:
    """stderr lines up to the first containing ``text`` (the tail says what it follows on start)."""
    assert process.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stderr], [], [], 0.5)
        if ready:
            line = process.stderr.readline()
            seen.append(line)
            if text in line:
                return seen
    raise AssertionError(f"no {text!r} on stderr within {timeout_s} s: {seen}")


def test_two_concurrent_tails_each_see_every_alert_and_stop_on_signals_to_their_group(
    test_settings: Settings,
) -> None:
    ensure_topics(test_settings.kafka, [test_settings.topics.alerts])
    viewers = [_tail_process(test_settings, "--json"), _tail_process(test_settings, "--json")]
    try:
        for viewer in viewers:
            _wait_for_line(viewer, "alerts tail: following", 60)
        time.sleep(3)  # each viewer has resolved "now" on every partition before anything is written
        records = alert_run(10)  # 20 records over several partitions (keyed by device)
        produce(test_settings.kafka, test_settings.topics.alerts, records)
        time.sleep(5)
        for viewer, sig in zip(viewers, (signal.SIGINT, signal.SIGTERM), strict=True):
            os.killpg(viewer.pid, sig)  # to the process group, as Ctrl-C in a terminal does
        outputs = [viewer.communicate(timeout=30) for viewer in viewers]
    finally:
        for viewer in viewers:
            if viewer.poll() is None:
                viewer.kill()
    expected = sorted(map(encode_alert, records))
    for viewer, (out, err) in zip(viewers, outputs, strict=True):
        assert viewer.returncode == 0, err
        assert sorted(map(encode_alert, lines(out))) == expected  # each sees all 20, not half
        assert "alerts tail: 20 shown" in err and "Traceback" not in err, err


def test_since_starts_at_the_alerts_written_in_that_window(test_settings: Settings) -> None:
    recent = alert_run(3)
    old = alert_run(2, start_ms=int(time.time() * 1000) - 3 * 3600_000)
    producer = Producer({**test_settings.kafka.client_config(), "linger.ms": 5})
    ensure_topics(test_settings.kafka, [test_settings.topics.alerts])
    two_hours_ago = int(time.time() * 1000) - 2 * 3600_000
    for record in old:  # written (Kafka timestamp) two hours ago
        key, value, headers = alert_message(record)
        producer.produce(test_settings.topics.alerts, value, key=key, headers=headers, timestamp=two_hours_ago)
    assert producer.flush(30) == 0
    produce(test_settings.kafka, test_settings.topics.alerts, recent)
    shown = lines(run_tail(test_settings, "--since", "1h", "--json", "--timeout", "10").output)
    assert sorted(map(encode_alert, shown)) == sorted(map(encode_alert, recent))
    everything = lines(run_tail(test_settings, "--from-beginning", "--json", "--limit", "10", "--timeout", "30").output)
    assert len(everything) == 10


def test_since_with_a_group_is_refused_in_one_line(test_settings: Settings) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "iotwatch.application",
            "alerts",
            "tail",
            "--since",
            "1h",
            "--group",
            "g",
            "--kafka",
            "127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "--since" in result.stderr


def test_a_viewer_shows_the_backlog_in_time_order_across_partitions(test_settings: Settings) -> None:
    """``--from-beginning`` without a group: what the topic holds, oldest first, not partition
    by partition; each partition still ends with what was written to it last."""
    from iotwatch.clients.kafka import topic_partitions

    topic = test_settings.topics.alerts
    ensure_topics(test_settings.kafka, [topic])
    partitions = topic_partitions(test_settings.kafka, [topic], "READ")[topic]
    assert partitions >= 2
    records = alert_run(6)
    producer = Producer(test_settings.kafka.client_config())
    for n, record in enumerate(records):  # written in this order, to partitions 0, 1, 0, 1, ...
        key, value, headers = alert_message(record)
        producer.produce(topic, value, key=key, headers=headers, partition=n % 2)
        producer.flush(10)
        time.sleep(0.005)  # a later record has a later timestamp
    shown = lines(run_tail(test_settings, "--from-beginning", "--json", "--timeout", "15").output)
    assert list(map(encode_alert, shown)) == list(map(encode_alert, records))


def test_a_viewer_started_now_reads_no_retained_alert_and_shows_new_ones(test_settings: Settings) -> None:
    """Starting now positions every partition at its end by time (no retained alert is read),
    so the first new alert shows at once, even on partitions that hold only old alerts."""
    from iotwatch.clients.kafka import TopicFollower

    produce(test_settings.kafka, test_settings.topics.alerts, alert_run(4))
    started = time.monotonic()
    follower = TopicFollower(test_settings.kafka, [test_settings.topics.alerts], since_ms=int(time.time() * 1000))
    assert follower.catch_up(30) == [] and time.monotonic() - started < 15
    fresh = alert_run(1)
    produce(test_settings.kafka, test_settings.topics.alerts, fresh)
    deadline, seen = time.monotonic() + 30, []
    while len(seen) < len(fresh) and time.monotonic() < deadline:
        seen += follower.poll(0.5)
    assert sorted(encode_alert(decode_alert(m.value())) for m in seen) == sorted(map(encode_alert, fresh))
