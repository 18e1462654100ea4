"""``iotwatch respond`` against the real broker and MQTT, with simulated devices that obey:
alerts become commands, replies and outcomes land in the audit trail, silence escalates,
bad replies are dead-lettered, and a restart sends nothing twice."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from click.testing import CliRunner
from confluent_kafka import Message

from iotwatch.application.cli import cli
from iotwatch.contract.alerts import AlertRecord, decode_alert
from iotwatch.contract.dead_letters import DeadLetter
from iotwatch.contract.oncall import CommandAudit, CommandOutcome, decode
from iotwatch.responder.policy import DEFAULT_POLICIES
from iotwatch.responder.service import Responder
from iotwatch.settings import Settings
from tests.helpers import InThread, read_topic, wait_for
from tests.support.alerts import changed, make_alert, produce
from tests.support.clock import ShiftedClock, next_rounds
from tests.support.homes import LEAK, SITE, THERMOSTAT, Obeying, home_with_faults, mode, with_respond


def responding(settings: Settings, clock: ShiftedClock) -> InThread:
    return InThread(lambda stop: Responder(settings, DEFAULT_POLICIES, stop, clock))


def trail(settings: Settings) -> dict[tuple[str, int], CommandAudit]:
    """The latest audit record per (device, attempt), read back from the compacted topic."""
    latest: dict[tuple[str, int], CommandAudit] = {}
    for m in read_topic(settings.kafka, settings.topics.commands, idle_s=1.0):
        audit = decode(m.value(), CommandAudit)
        latest[(audit.device_id, audit.attempt)] = audit
    return latest


def alerts(settings: Settings) -> list[AlertRecord]:
    """The alert records on the topic (the test also put a record there that is not one)."""
    return [
        decode_alert(m.value())
        for m in read_topic(settings.kafka, settings.topics.alerts, idle_s=0.5)
        if m.value().startswith(b"{")
    ]


def statuses(audit: CommandAudit) -> list[str]:
    return [step.status.value for step in audit.history]


def test_responder_commands_devices_audits_escalates_and_restarts_cleanly(
    test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    settings = with_respond(
        test_settings, client_id=f"responder-{unique}", reply_timeout_s=6.0, command_ttl_s=8.0, max_attempts=2
    )
    sim = home_with_faults(tmp_path)
    start = int(time.time() * 1000) - 10_000
    hvac = make_alert(THERMOSTAT, "thermostat", SITE, "stuck_hvac", "major", "raised", start)
    leak = make_alert(LEAK, "leak_sensor", SITE, "water_leak", "critical", "raised", start)
    ghost = make_alert("home-00009-thermostat-0", "thermostat", "home-00009", "stuck_hvac", "major", "raised", start)
    other = make_alert(LEAK, "leak_sensor", SITE, "anomaly_score", "warning", "raised", start)  # no policy
    # not an alert, and an alert whose device id cannot be a topic level: reported, no command, no crash
    unaddressable = changed(
        make_alert("home-1-thermostat-9", "thermostat", "home-1", "stuck_hvac", "major", "raised", start),
        device_id="home-1/thermostat+9",
    )
    produce(settings.kafka, settings.topics.alerts, [hvac, leak, ghost, other, b"\x00not an alert", unaddressable])

    devices = Obeying(sim, settings.mqtt, f"sim-{unique}")
    clock = ShiftedClock()
    running = responding(settings, clock)
    try:
        wait_for(lambda: mode(sim, THERMOSTAT) == 0 and mode(sim, LEAK) == 0, 30, "both faults ended by commands")
        # the streaming job sees the recovery and clears the alerts (within the reply timeout, else: retry)
        now = int(time.time() * 1000)
        produce(
            settings.kafka,
            settings.topics.alerts,
            [changed(hvac, state="cleared", detected_at_ms=now), changed(leak, state="cleared", detected_at_ms=now)],
        )
        wait_for(
            lambda: (
                trail(settings).get(("home-00009-thermostat-0", 2)) is not None
                and trail(settings)[("home-00009-thermostat-0", 2)].status.value == "escalated"
            ),
            60,
            "the device that never answers escalated after two attempts",
        )
        # a reply that is not one, and one for a command nobody sent: dead letters with a reason
        devices.channel.client.publish(f"iot/{SITE}/thermostat/{THERMOSTAT}/commands/ack", b"\xff", qos=1)
        devices.channel.client.publish(
            f"iot/{SITE}/thermostat/{THERMOSTAT}/commands/ack",
            b'{"v":1,"command_id":"nope","device_id":"%s","status":"done","at_ms":1}' % THERMOSTAT.encode(),
            qos=1,
        )
        wait_for(lambda: running.service.counts["dead_lettered"] == 2, 15, "two dead letters")
        # the escalation pages on-call as a critical alert; it clears when the original alert does
        escalations = lambda: [a for a in alerts(settings) if a.rule == "command_escalation"]  # noqa: E731
        wait_for(lambda: len(escalations()) == 1, 15, "the escalation alert")
        produce(
            settings.kafka,
            settings.topics.alerts,
            [changed(ghost, state="cleared", detected_at_ms=int(time.time() * 1000))],
        )
        wait_for(lambda: [a.state for a in escalations()] == ["raised", "cleared"], 15, "the escalation cleared")
        raised = escalations()[0]
        assert (raised.severity, raised.device_id, raised.caused_by) == (
            "critical",
            "home-00009-thermostat-0",
            ghost.alert_id,
        )
        assert raised.runbook_url.endswith("#command_escalation") and "reset_hvac did not fix" in raised.message
        clock.advance(6.5)  # past the reply timeout: a done command of a cleared alert is not retried
        next_rounds(running.service)
    finally:
        first = running.close()
    audits = trail(settings)
    assert statuses(audits[(THERMOSTAT, 1)]) == ["sent", "accepted", "done"]
    assert statuses(audits[(LEAK, 1)]) == ["sent", "accepted", "done"]
    assert audits[(LEAK, 1)].name == "close_valve" and audits[(LEAK, 1)].alert_id == leak.alert_id
    assert audits[(THERMOSTAT, 1)].issued_by == "responder" and audits[(THERMOSTAT, 1)].policy == "reset-stuck-hvac"
    assert statuses(audits[("home-00009-thermostat-0", 1)]) == ["sent", "timed_out"]
    assert statuses(audits[("home-00009-thermostat-0", 2)]) == ["sent", "timed_out", "escalated"]
    # never answered: timed out only once expired (past the reply timeout), so it can never run late
    first_attempt = audits[("home-00009-thermostat-0", 1)]
    assert first_attempt.history[1].at_ms >= first_attempt.expires_at_ms > first_attempt.issued_at_ms + 6_000
    assert set(audits) == {(THERMOSTAT, 1), (LEAK, 1), ("home-00009-thermostat-0", 1), ("home-00009-thermostat-0", 2)}
    assert first["commands_sent"] == 4 and first["escalated"] == 1 and first["alerts_without_device"] == 1
    assert running.service.book.malformed == 1
    dead = [m for m in read_topic(settings.kafka, settings.topics.dlq, expected=2)]
    letters = [DeadLetter.of_message(m.value(), m.key(), m.headers()) for m in dead]
    assert sorted(letter.reason for letter in letters) == ["invalid_json", "unknown_command"]
    assert {letter.stage for letter in letters} == {"responder"}
    truth = {r.kind: r for r in sim.injector.records}
    assert truth["stuck_hvac"].ended_by_command == audits[(THERMOSTAT, 1)].command_id
    assert truth["water_leak"].ended_by_command == audits[(LEAK, 1)].command_id

    # a restart rebuilds the state from the topics: nothing is sent again
    running = responding(settings, clock)
    try:
        next_rounds(running.service)  # it has acted on all it rebuilt
    finally:
        again = running.close()
        devices.close()
    assert again.get("commands_sent", 0) == 0 and again.get("escalated", 0) == 0, again
    assert len([a for a in alerts(settings) if a.rule == "command_escalation"]) == 2  # nothing written again

    # operators read the trail with `iotwatch commands`
    shown = CliRunner().invoke(
        cli,
        ["commands", "--kafka", settings.kafka.bootstrap_servers, "--device", LEAK, "--json"],
        env={"IOTWATCH_TOPIC_COMMANDS": settings.topics.commands},
    )
    assert shown.exit_code == 0, shown.output
    listing = json.loads(shown.stdout)
    assert (listing["total"], listing["shown"], listing["truncated"]) == (1, 1, False)
    (listed,) = listing["commands"]
    assert listed["status"] == "done" and [step["status"] for step in listed["history"]] == ["sent", "accepted", "done"]
    table = CliRunner().invoke(
        cli,
        ["commands", "--kafka", settings.kafka.bootstrap_servers],
        env={"IOTWATCH_TOPIC_COMMANDS": settings.topics.commands},
    )
    assert table.exit_code == 0 and "escalated" in table.stdout and "close_valve" in table.stdout


def test_a_command_unanswered_when_its_alert_clears_times_out_and_is_not_sent_again(
    test_settings: Settings, unique: str
) -> None:
    """The device never answers and the alert clears first: once expired and past the reply
    timeout the command is ``timed_out`` (not left ``sent``, as if still in flight), and no
    other attempt goes out, since nothing needs correcting any more."""
    settings = with_respond(test_settings, client_id=f"responder-{unique}", reply_timeout_s=6.0, command_ttl_s=8.0)
    device = "home-00077-thermostat-0"
    start = int(time.time() * 1000) - 10_000
    hvac = make_alert(device, "thermostat", "home-00077", "stuck_hvac", "major", "raised", start)
    produce(settings.kafka, settings.topics.alerts, [hvac])
    clock = ShiftedClock()
    running = responding(settings, clock)
    try:
        wait_for(lambda: running.service.counts["commands_sent"] == 1, 30, "the command sent")
        wait_for(lambda: (device, 1) in trail(settings), 30, "the command's audit")
        produce(
            settings.kafka, settings.topics.alerts, [changed(hvac, state="cleared", detected_at_ms=int(clock() * 1000))]
        )
        next_rounds(running.service)
        # not expired yet: the device may still run it
        assert trail(settings)[(device, 1)].status == CommandOutcome.SENT
        clock.advance(8.0 + 6.0 + 1.0)
        wait_for(lambda: trail(settings)[(device, 1)].status == CommandOutcome.TIMED_OUT, 30, "the command timed out")
        next_rounds(running.service)
    finally:
        counts = running.close()
    audits = trail(settings)
    assert set(audits) == {(device, 1)} and statuses(audits[(device, 1)]) == ["sent", "timed_out"]
    assert counts["commands_sent"] == 1 and counts.get("escalated", 0) == 0


def test_a_step_read_back_after_a_newer_one_does_not_undo_it(test_settings: Settings) -> None:
    """The responder follows the command topic it writes: its own older records come back after
    it moved on. Taking them as news re-ran the timeout and escalated a second time (CI)."""
    responder = Responder(test_settings, DEFAULT_POLICIES, threading.Event())
    sent = CommandAudit(
        1,
        "c1",
        "reset-stuck-hvac",
        "a1",
        "stuck_hvac",
        THERMOSTAT,
        "thermostat",
        SITE,
        "reset_hvac",
        "responder",
        1_000,
        9_000,
        2,
        CommandOutcome.SENT,
    ).with_step(CommandOutcome.SENT, 1_000)
    escalated = sent.with_step(CommandOutcome.TIMED_OUT, 9_000).with_step(CommandOutcome.ESCALATED, 9_000)
    responder._remember(escalated)
    responder._remember(sent)  # read back from the topic
    assert responder.audits["c1"].status == CommandOutcome.ESCALATED
    assert responder.latest[("a1", "reset-stuck-hvac")].status == CommandOutcome.ESCALATED


def test_an_emergency_record_without_its_alert_id_is_skipped(test_settings: Settings) -> None:
    """A keyless record on the emergencies topic (written by another tool) is counted and
    skipped: reading its key as the alert id stopped the responder with an AttributeError."""
    responder = Responder(test_settings, DEFAULT_POLICIES, threading.Event())
    emergencies = test_settings.topics.emergencies
    responder.apply(Message(topic=emergencies, key=None, value=b"{}"))
    responder.apply(Message(topic=emergencies, key=b"a1", value=b"{}"))
    assert responder.notified == {"a1"}
    assert responder.counts["malformed_emergency"] == 1
