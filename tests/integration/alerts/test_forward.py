"""``iotwatch alerts forward --webhook URL`` (the tree of one ``record`` receiver) against the
real broker and a webhook that fails on purpose."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from iotwatch.alerts.dispatch import Dispatcher, ForwardOptions
from iotwatch.alerts.notification import record_body
from iotwatch.alerts.routing import single_receiver
from iotwatch.clients.kafka import ensure_topics
from iotwatch.contract.dead_letters import DeadLetter
from iotwatch.settings import AlertsSettings, Settings
from tests.helpers import read_topic, user_env, wait_for
from tests.support.alerts import alert_run, key, make_alert, produce

FAST = {"webhook_timeout_s": 0.5, "retry_initial_s": 0.05, "retry_max_s": 0.5, "session_timeout_ms": 6000}


def committed_everything(settings: Settings, group: str) -> bool:
    """The group's committed offset is the log end on every partition that holds records."""
    records = read_topic(settings.kafka, settings.topics.alerts, idle_s=1.0)
    ends: dict[int, int] = {}
    for m in records:
        ends[m.partition()] = max(ends.get(m.partition(), 0), m.offset() + 1)
    consumer = Consumer({**settings.kafka.client_config(), "group.id": group})
    try:
        committed = consumer.committed([TopicPartition(settings.topics.alerts, p) for p in ends], timeout=10)
    finally:
        consumer.close()
    return all(tp.offset == ends[tp.partition] for tp in committed)


def forward_in_thread(
    settings: Settings,
    config: AlertsSettings,
    url: str,
    options: ForwardOptions,
) -> tuple[threading.Event, threading.Thread, dict[str, Any]]:
    stop, result = threading.Event(), {}
    tree = single_receiver(url, timeout_s=config.webhook_timeout_s)
    forwarder = Dispatcher(settings, config, tree, stop, options=options)
    thread = threading.Thread(target=lambda: result.update(forwarder.run()), daemon=True)
    thread.start()
    return stop, thread, result


def test_forward_delivers_all_through_failures_dead_letters_and_dedupes(
    test_settings: Settings, unique: str, tmp_path: Path, webhook: Any
) -> None:
    records = alert_run(12)
    rejected = make_alert("car-9", "vehicle_edr", "fleet-9", "crash", "critical", "raised", 1)
    acknowledged = json.dumps({**record_body(records[0]), "state": "acknowledged"}).encode()
    produce(
        test_settings.kafka,
        test_settings.topics.alerts,
        [*records[:12], records[0], rejected, b"{not json", acknowledged, *records[12:]],
    )
    total, expected = len(records) + 4, {key(r) for r in records}
    hook, url = webhook(fail_every=3, retry_after_at=4, stall_at=5, stall_s=1.5, reject={rejected.alert_id})
    dead_topic = f"{test_settings.topics.alerts}.dead"
    ensure_topics(test_settings.kafka, [dead_topic])
    config = AlertsSettings(state_dir=tmp_path, dead_letter_topic=dead_topic, **FAST)

    stop, thread, counts = forward_in_thread(
        test_settings, config, url, ForwardOptions(f"fwd-{unique}", from_beginning=True, limit=total)
    )
    thread.join(60)
    assert not thread.is_alive(), f"forward did not finish: {len(hook.requests)} requests"
    assert set(hook.delivered) == expected  # none missing, nothing else
    assert all(
        k == f"{body['alert_id']}:{body['state']}" and body["text"].startswith(":") for k, _, body in hook.requests
    )
    assert counts["delivered"] == len(records) and counts["duplicates"] == 1
    # the record that is not JSON and the one whose state is no alert state: dead letters with reasons
    assert counts["dead_lettered"] == 3 and counts["waiting"] == 0 and counts["malformed"] == 2
    assert {"http_503", "http_429", "timeout"} <= set(counts["failures"]), counts
    dead = [json.loads(line) for line in (tmp_path / "dead-notifications.jsonl").read_text().splitlines()]
    assert sorted(d["reason"] for d in dead) == ["http_400", "malformed", "malformed"]
    assert any("`$.state`" in d["detail"] for d in dead)
    assert next(d for d in dead if d["reason"] == "http_400")["notification"] == record_body(rejected)
    assert all(d["raw"] for d in dead if d["reason"] == "malformed")
    on_topic = read_topic(test_settings.kafka, dead_topic, expected=3)
    letters = [DeadLetter.of_message(m.value(), m.key(), m.headers()) for m in on_topic]
    assert sorted((d.reason, d.stage) for d in letters) == [
        ("http_400", "alerts-forward"),
        ("malformed", "alerts-forward"),
        ("malformed", "alerts-forward"),
    ]
    assert {d.original for d in letters if d.reason == "malformed"} == {b"{not json", acknowledged}
    assert committed_everything(test_settings, f"fwd-{unique}")
    # the stalled request counts as delivered server-side while the client retried: the one repeat
    assert len(hook.delivered) - len(expected) <= 1

    # a restart in the same group replays the topics for its state and posts nothing again
    requests_before = len(hook.requests)
    stop, thread, again = forward_in_thread(
        test_settings, config, url, ForwardOptions(f"fwd-{unique}", from_beginning=True, timeout_s=3)
    )
    thread.join(60)
    assert len(hook.requests) == requests_before
    assert again["alert_records"] == total and again["delivered"] == again["dead_lettered"] == again["waiting"] == 0


def forward_command(
    settings: Settings, url: str, group: str, state_dir: Path, webhook_timeout_s: float = 0.5
) -> subprocess.Popen[str]:
    env = user_env()
    env.update(
        {
            "IOTWATCH_TOPIC_ALERTS": settings.topics.alerts,
            "IOTWATCH_ALERTS_SESSION_TIMEOUT_MS": "6000",
            "IOTWATCH_ALERTS_RETRY_INITIAL_S": "0.05",
        }
    )
    argv = [
        sys.executable,
        "-m",
        "iotwatch.application",
        "--log-level",
        "ERROR",
        "alerts",
        "forward",
        "--kafka",
        settings.kafka.bootstrap_servers,
        "--webhook",
        url,
        "--group",
        group,
        "--state-dir",
        str(state_dir),
        "--webhook-timeout",
        str(webhook_timeout_s),
        "--retry-max",
        "0.5",
        "--json",
    ]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop_gracefully(process: subprocess.Popen[str]) -> dict[str, Any]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    return json.loads(out)


def test_acceptance_forward_across_kill_9(test_settings: Settings, unique: str, tmp_path: Path, webhook: Any) -> None:
    records = alert_run(30)
    produce(test_settings.kafka, test_settings.topics.alerts, records)
    expected = {key(r) for r in records}
    hook, url = webhook(fail_every=3, retry_after_at=4, stall_at=7, stall_s=1.0, delay_s=0.03)

    first = forward_command(test_settings, url, f"fwd-{unique}", tmp_path)
    try:
        wait_for(lambda: len(set(hook.delivered)) >= 20, 60, "20 deliveries")
    finally:
        first.kill()  # SIGKILL: no chance to commit or close
        first.communicate(timeout=20)
    at_kill = len(set(hook.delivered))
    assert at_kill < len(expected), "the run finished before the kill: make it slower"

    second = forward_command(test_settings, url, f"fwd-{unique}", tmp_path)
    try:
        wait_for(lambda: set(hook.delivered) >= expected, 90, "every alert delivered")
    finally:
        counts = stop_gracefully(second)

    delivered = Counter(hook.delivered)
    assert set(delivered) == expected  # none missing, no strangers
    repeats = {k: n for k, n in delivered.items() if n > 1}
    # a repeat is only ever an alert already delivered (same Idempotency-Key): the stalled request
    # the client gave up on, and the one in flight at the kill -- not the ~20 committed before it
    assert sum(n - 1 for n in repeats.values()) <= 2, repeats
    assert counts["delivered"] + counts["duplicates"] >= len(expected) - at_kill
    assert counts["waiting"] == 0 and counts["dead_lettered"] == 0
    assert committed_everything(test_settings, f"fwd-{unique}")


def test_sigterm_finishes_the_post_in_flight(
    test_settings: Settings, unique: str, tmp_path: Path, webhook: Any
) -> None:
    records = alert_run(3)
    produce(test_settings.kafka, test_settings.topics.alerts, records)
    hook, url = webhook(fail_every=0, retry_after_at=None, stall_at=None, delay_s=0.6)
    process = forward_command(test_settings, url, f"fwd-{unique}", tmp_path, webhook_timeout_s=5)
    try:
        wait_for(lambda: len(hook.requests) >= 2, 60, "a post in flight")
    finally:
        counts = stop_gracefully(process)  # while the 2nd post waits for its (slow) answer
    assert counts["delivered"] == len(hook.requests) == 2 and counts["waiting"] == len(records) - 2

    # resumes after the 2 committed
    again = forward_command(test_settings, url, f"fwd-{unique}", tmp_path, webhook_timeout_s=5)
    try:
        wait_for(lambda: set(hook.delivered) == {key(r) for r in records}, 60, "the rest")
    finally:
        counts = stop_gracefully(again)
    assert len(hook.delivered) == len(records) and counts["duplicates"] == 0


def test_timeout_ends_a_run_against_a_dead_receiver(test_settings: Settings, unique: str, tmp_path: Path) -> None:
    """Acceptance: ``--timeout 5`` against a receiver that accepts connections and never
    answers (longer than the default 10 s post timeout) ends within 10 s, exit 0, and says
    nothing of the secret parts of the URL."""
    import socket
    import time

    produce(test_settings.kafka, test_settings.topics.alerts, alert_run(1))
    black_hole = socket.socket()
    black_hole.bind(("127.0.0.1", 0))
    black_hole.listen(16)  # never accepted, never answered
    port = black_hole.getsockname()[1]
    url = f"http://user:pw@127.0.0.1:{port}/services/T00/B00/SECRET?token=abc"
    env = user_env()
    env.update(
        {
            "IOTWATCH_TOPIC_ALERTS": test_settings.topics.alerts,
            "IOTWATCH_ALERTS_RETRY_INITIAL_S": "0.2",
            "IOTWATCH_ALERTS_RETRY_MAX_S": "1",
        }
    )
    argv = [
        sys.executable,
        "-m",
        "iotwatch.application",
        "alerts",
        "forward",
        "--kafka",
        test_settings.kafka.bootstrap_servers,
        "--webhook",
        url,
        "--group",
        f"fwd-{unique}",
        "--state-dir",
        str(tmp_path),
        "--timeout",
        "5",
    ]
    started = time.monotonic()
    try:
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    finally:
        black_hole.close()
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert elapsed <= 30, f"ran {elapsed:.1f} s: the 5 s timeout did not end the run"
    assert "SECRET" not in result.stderr + result.stdout and "token" not in result.stderr + result.stdout
    assert "alerts forward: alert records 2" in result.stdout and "left for the next run" in result.stdout


def test_a_receiver_down_holds_the_backlog_and_nothing_is_committed_past_it(
    test_settings: Settings, unique: str, tmp_path: Path, webhook: Any, caplog: Any
) -> None:
    """A receiver that fails every post: the first record is retried with a growing back-off,
    the rest wait behind it, the group commits nothing; once the receiver is back every record
    is delivered and committed. Each retry names the receiver (scheme, host, port, first path
    segment), never its secrets."""
    import logging
    import time

    caplog.set_level(logging.WARNING, logger="iotwatch.alerts.dispatch")
    records = alert_run(3)
    produce(test_settings.kafka, test_settings.topics.alerts, records)
    hook, url = webhook(fail_every=1, retry_after_at=None, stall_at=None)
    base = url.removesuffix("/hook")
    url = f"{base.replace('http://', 'http://user:secret@')}/hook/T00/SECRET?token=abc"
    config = AlertsSettings(state_dir=tmp_path, **FAST)
    stop, thread, result = forward_in_thread(
        test_settings, config, url, ForwardOptions(f"fwd-{unique}", from_beginning=True)
    )
    try:
        wait_for(lambda: hook.requests, 60, "the first post")
        time.sleep(4)  # every post fails meanwhile
        assert not hook.delivered and len({k for k, _, _ in hook.requests}) == 1  # the first record only
        assert not committed_everything(test_settings, f"fwd-{unique}")
        hook.fail_every = 0
        wait_for(lambda: set(hook.delivered) == {key(r) for r in records}, 60, "every alert delivered")
    finally:
        stop.set()
        thread.join(30)
    assert result["commit_failures"] == 0 and result["retries"] >= 4, result
    assert committed_everything(test_settings, f"fwd-{unique}")
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert retries and all(
        m.startswith(f"receiver webhook ({base}/hook/…): post failed (http_503)") for m in retries
    ), retries
    assert not any("secret" in m.lower() or "token" in m for m in retries)


def test_from_latest_skips_what_the_topic_held_before_the_first_run(
    test_settings: Settings, unique: str, tmp_path: Path, webhook: Any
) -> None:
    before, after = alert_run(2), alert_run(1, start_ms=1_000)
    produce(test_settings.kafka, test_settings.topics.alerts, before)
    hook, url = webhook(fail_every=0, retry_after_at=None, stall_at=None)
    config = AlertsSettings(state_dir=tmp_path, **FAST)
    stop, thread, result = forward_in_thread(
        test_settings, config, url, ForwardOptions(f"fwd-{unique}", from_beginning=False)
    )
    try:
        wait_for(lambda: committed_everything(test_settings, f"fwd-{unique}"), 30, "the start committed")
        produce(test_settings.kafka, test_settings.topics.alerts, after)
        wait_for(lambda: len(hook.delivered) == len(after), 30, "the alerts written after the start")
    finally:
        stop.set()
        thread.join(30)
    assert set(hook.delivered) == {key(r) for r in after} and result["delivered"] == len(after)
