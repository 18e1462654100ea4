"""``alerts forward --routes``: routing, grouping, silences, acknowledgements, repeats, resolved
notifications and a restart, against the real broker and real HTTP receivers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from iotwatch.alerts.actions import acknowledge, add_silence
from iotwatch.alerts.book import load_book
from iotwatch.alerts.dispatch import Dispatcher
from iotwatch.alerts.routing import parse_routing
from iotwatch.contract.oncall import AlertState, AlertStep, Matchers, Notification, decode
from iotwatch.settings import AlertsSettings, Settings
from tests.helpers import InThread, read_topic, user_env, wait_for
from tests.support.alerts import changed, make_alert, produce

GROUP_WAIT, GROUP_INTERVAL, REPEAT = 1.0, 2.0, 4.0


def routing(urls: dict[str, str]) -> dict[str, Any]:
    return {
        "receivers": {name: {"url": url} for name, url in urls.items()},
        "route": {
            "receiver": "default",
            "group_by": ["site", "rule"],
            "group_wait": f"{GROUP_WAIT}s",
            "group_interval": f"{GROUP_INTERVAL}s",
            "repeat_interval": f"{REPEAT}s",
            "routes": [
                {"match": {"severity": "critical"}, "receiver": "pager", "group_by": ["device_id"], "continue": True},
                {"match": {"site": ["home-1", "home-2"]}, "receiver": "homes"},
            ],
        },
    }


def forwarding(settings: Settings, config: AlertsSettings, tree: Any) -> InThread:
    return InThread(lambda stop: Dispatcher(settings, config, tree, stop))


def bodies(hook: Any) -> list[dict[str, Any]]:
    return [body for _, status, body in hook.requests if status == 200]


def listed(body: dict[str, Any], field: str = "alerts") -> set[str]:
    return {a["alert_id"] for a in body[field]}


def test_forwarder_routes_groups_silences_repeats_resolves_and_survives_a_restart(
    test_settings: Settings, tmp_path: Path, webhook: Any
) -> None:
    hooks, urls = {}, {}
    for name in ("default", "pager", "homes"):
        hooks[name], urls[name] = webhook(fail_every=0, retry_after_at=None, stall_at=None)
    tree = parse_routing(routing(urls))
    config = AlertsSettings(state_dir=tmp_path, retry_initial_s=0.05, retry_max_s=0.5)
    kafka, topics = test_settings.kafka, test_settings.topics
    start = int(time.time() * 1000) - 60_000

    # silenced before it fires: never sent anywhere
    add_silence(test_settings, Matchers(device_id="car-9"), 3600, "carol", "crash test rig")
    burst = [
        make_alert(f"meter-{n}", "smart_meter", "fleet-x", "anomaly_score", "warning", "raised", start + n)
        for n in range(20)
    ]
    crash_acked = make_alert("car-1", "vehicle_edr", "fleet-1", "crash", "critical", "raised", start)
    crash_open = make_alert("car-2", "vehicle_edr", "fleet-1", "crash", "critical", "raised", start)
    crash_silenced = make_alert("car-9", "vehicle_edr", "fleet-1", "crash", "critical", "raised", start)
    home_leak = make_alert("leak-1", "leak_sensor", "home-1", "water_leak", "critical", "raised", start)
    produce(kafka, topics.alerts, [*burst, crash_acked, crash_open, crash_silenced, home_leak])

    running = forwarding(test_settings, config, tree)
    try:
        # the burst of 20: one notification to the default receiver listing all of them
        wait_for(
            lambda: (
                len(bodies(hooks["default"])) >= 1
                and len(bodies(hooks["pager"])) >= 3
                and len(bodies(hooks["homes"])) >= 1
            ),
            30,
            "first notifications",
        )
        first = bodies(hooks["default"])
        assert len(first) == 1 and listed(first[0]) == {a.alert_id for a in burst}
        assert first[0]["text"].startswith(":large_blue_circle: [FIRING:20] site=fleet-x rule=anomaly_score")
        # critical alerts page per device (and the leak also goes on to the homes receiver); the silenced never
        paged = {a for body in bodies(hooks["pager"]) for a in listed(body)}
        assert paged == {crash_acked.alert_id, crash_open.alert_id, home_leak.alert_id}
        assert [listed(b) for b in bodies(hooks["homes"])] == [{home_leak.alert_id}]
        assert all(crash_silenced.alert_id not in listed(b) for h in hooks.values() for b in bodies(h))

        # car-1 is acknowledged: car-2 (and the unacknowledged leak) repeat after the interval, car-1 does not
        acknowledge(test_settings, load_book(test_settings), crash_acked.alert_id, "alice", "driver called")
        wait_for(
            lambda: (
                sum(b["kind"] == "repeat" for b in bodies(hooks["pager"])) >= 4
                and sum(b["kind"] == "repeat" for b in bodies(hooks["homes"])) >= 1
            ),
            30,
            "two repeats each of the unacknowledged critical alerts, and the leak's at the homes receiver",
        )
        repeats = [b for b in bodies(hooks["pager"]) if b["kind"] == "repeat"]
        assert {a for b in repeats for a in b["repeated"]} == {crash_open.alert_id, home_leak.alert_id}
        assert not any(crash_acked.alert_id in listed(b) for b in repeats)
        # the leak repeats at the homes receiver too (critical, unacknowledged), as repeats only
        later = bodies(hooks["homes"])[1:]
        assert later and all(b["kind"] == "repeat" and b["repeated"] == [home_leak.alert_id] for b in later)
    finally:
        running.close()

    # restart: nothing already sent is sent again; what happened while it was down is sent
    before = {name: len(bodies(hook)) for name, hook in hooks.items()}
    cleared = changed(crash_open, state="cleared", detected_at_ms=int(time.time() * 1000))
    late = make_alert("meter-99", "smart_meter", "fleet-x", "anomaly_score", "warning", "raised", start + 99)
    produce(kafka, topics.alerts, [cleared, late])
    running = forwarding(test_settings, config, tree)
    try:
        wait_for(lambda: len(bodies(hooks["default"])) > before["default"], 30, "the alert raised while down")
        wait_for(lambda: any(b["kind"] == "resolved" for b in bodies(hooks["pager"])), 30, "car-2 resolved")
        time.sleep(GROUP_INTERVAL)
        after_restart = bodies(hooks["default"])[before["default"] :]
        assert [listed(b) for b in after_restart] == [{a.alert_id for a in [*burst, late]}]
        assert "[FIRING:21]" in after_restart[0]["text"]
        resolved = next(b for b in bodies(hooks["pager"]) if b["kind"] == "resolved")  # car-2's
        assert listed(resolved, "resolved") == {crash_open.alert_id} and resolved["alerts"] == []
        assert resolved["text"].startswith(":large_green_circle: [RESOLVED:1]")
        # what each receiver had before is known from the log: no "firing" notification again, only
        # repeats of the unacknowledged critical alerts and the resolution
        assert all(b["kind"] == "repeat" for b in bodies(hooks["homes"])[before["homes"] :])
        assert {b["kind"] for b in bodies(hooks["pager"])[before["pager"] :]} <= {"repeat", "resolved"}
    finally:
        counts = running.close()
    assert counts.get("dead_lettered", 0) == 0 and counts["malformed"] == 0

    # the acknowledged crash clears: the forwarder records the step on the alert-state topic, carrying
    # the acknowledgement (compaction keeps only this record), once -- not again after a restart
    produce(kafka, topics.alerts, [changed(crash_acked, state="cleared", detected_at_ms=int(time.time() * 1000))])
    for _ in range(2):
        running = forwarding(test_settings, config, tree)
        try:
            wait_for(
                lambda: any(
                    decode(m.value(), AlertState).action == AlertStep.CLEARED_AFTER_ACK
                    for m in read_topic(kafka, topics.alert_state, idle_s=0.5)
                ),
                30,
                "cleared_after_ack",
            )
            time.sleep(1.0)
        finally:
            running.close()
    steps = [decode(m.value(), AlertState) for m in read_topic(kafka, topics.alert_state, idle_s=1.0)]
    assert [(s.action, s.by, s.note) for s in steps] == [
        (AlertStep.ACKNOWLEDGED, "alice", "driver called"),
        (AlertStep.CLEARED_AFTER_ACK, "alice", "driver called"),
    ]
    assert steps[1].cleared_at_ms is not None and steps[1].at_ms == steps[0].at_ms
    assert load_book(test_settings).find(crash_acked.alert_id).status == "cleared_after_ack"

    # the notification log is the forwarder's state: one key per receiver and group
    log = [decode(m.value(), Notification) for m in read_topic(kafka, topics.notifications, idle_s=1.0)]
    assert {(n.receiver, n.group_key) for n in log} >= {("default", "0:{site=fleet-x,rule=anomaly_score}")}


def test_a_failing_receiver_holds_up_nobody_and_a_refusing_one_is_dead_lettered(
    test_settings: Settings, tmp_path: Path, webhook: Any
) -> None:
    down, down_url = webhook(fail_every=1, retry_after_at=None, stall_at=None)  # 503 to everything
    up, up_url = webhook(fail_every=0, retry_after_at=None, stall_at=None)
    start = int(time.time() * 1000) - 60_000
    crash = make_alert("car-1", "vehicle_edr", "fleet-1", "crash", "critical", "raised", start)
    meter = make_alert("meter-1", "smart_meter", "home-1", "anomaly_score", "warning", "raised", start)
    refused = make_alert("door-1", "door_sensor", "home-2", "out_of_range", "major", "raised", start)
    down.reject.add(refused.alert_id)  # answered 400: the request itself is wrong
    tree = parse_routing(
        {
            "receivers": {"down": {"url": down_url}, "up": {"url": up_url}},
            "route": {
                "receiver": "up",
                "group_wait": "0s",
                "routes": [
                    {"match": {"severity": "critical"}, "receiver": "down"},
                    {"match": {"rule": "out_of_range"}, "receiver": "down"},
                ],
            },
        }
    )
    produce(test_settings.kafka, test_settings.topics.alerts, [crash, meter, refused])
    config = AlertsSettings(state_dir=tmp_path, retry_initial_s=0.2, retry_max_s=0.5)
    running = forwarding(test_settings, config, tree)
    try:
        wait_for(
            lambda: len(bodies(up)) == 1 and sum(s == 503 for _, s, _ in down.requests) >= 3,
            30,
            "the working receiver notified while the other keeps failing",
        )
        assert listed(bodies(up)[0]) == {meter.alert_id}
        dead = tmp_path / "dead-notifications.jsonl"
        wait_for(dead.exists, 10, "the refused notification dead-lettered")
    finally:
        counts = running.close()
    (line,) = dead.read_text().splitlines()
    assert '"reason": "http_400"' in line and refused.alert_id in line
    assert counts["retries"] >= 3 and counts["dead_lettered"] == 1
    # the failing group's notification was never recorded as sent: the next run tries it again
    log = [
        decode(m.value(), Notification)
        for m in read_topic(test_settings.kafka, test_settings.topics.notifications, idle_s=1.0)
    ]
    assert {n.receiver for n in log} == {"up", "down"} and all(crash.alert_id not in n.firing for n in log)


def test_the_command_line_forwards_with_a_routing_file_and_stops_on_sigterm(
    test_settings: Settings, tmp_path: Path, webhook: Any
) -> None:
    hook, url = webhook(fail_every=0, retry_after_at=None, stall_at=None)
    routes = tmp_path / "routes.toml"
    routes.write_text(f'[receivers.oncall]\nurl = "{url}"\n\n[route]\nreceiver = "oncall"\ngroup_wait = "0s"\n')
    leak = make_alert("leak-1", "leak_sensor", "home-1", "water_leak", "critical", "raised", int(time.time() * 1000))
    produce(test_settings.kafka, test_settings.topics.alerts, [leak])
    topics = test_settings.topics
    env = user_env()
    env.update(
        {
            "IOTWATCH_TOPIC_ALERTS": topics.alerts,
            "IOTWATCH_TOPIC_ALERT_STATE": topics.alert_state,
            "IOTWATCH_TOPIC_SILENCES": topics.silences,
            "IOTWATCH_TOPIC_NOTIFICATIONS": topics.notifications,
            "IOTWATCH_INFLUX_URL": "",
        }
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "iotwatch.application",
            "--log-level",
            "ERROR",
            "alerts",
            "forward",
            "--kafka",
            test_settings.kafka.bootstrap_servers,
            "--routes",
            str(routes),
            "--state-dir",
            str(tmp_path / "state"),
            "--json",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: len(bodies(hook)) == 1, 60, "the notification")
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    counts = json.loads(out)
    assert (counts["alert_records"], counts["sent_firing"], counts["delivered"], counts["malformed"]) == (1, 1, 0, 0)
    assert listed(bodies(hook)[0]) == {leak.alert_id}
    bad = tmp_path / "bad.toml"
    bad.write_text('[receivers.a]\nurl = "ftp://x"\n[route]\nreceiver = "a"\n')
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "iotwatch.application",
            "alerts",
            "forward",
            "--kafka",
            test_settings.kafka.bootstrap_servers,
            "--routes",
            str(bad),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and refused.stderr.strip().splitlines()[-1].startswith(
        "iotwatch: error: routing file"
    )
