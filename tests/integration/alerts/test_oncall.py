"""``alerts list / ack / silence / silences / unsilence`` against the real broker: every action
is a record on its compacted topic, and the state folded back from the topics shows it."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner, Result

from iotwatch.alerts.book import load_book
from iotwatch.application.cli import cli
from iotwatch.contract.oncall import AlertState, Silence, decode
from iotwatch.errors import IotwatchError
from iotwatch.settings import Settings
from tests.helpers import read_topic
from tests.support.alerts import changed, make_alert, produce


def run(settings: Settings, *args: str, refused: bool = False) -> Result:
    """The command line in-process, pointed at this test's broker and topics; ``refused``: the
    command must fail with an error (what ``iotwatch`` prints as one line)."""
    topics = settings.topics
    env = {
        "IOTWATCH_TOPIC_ALERTS": topics.alerts,
        "IOTWATCH_TOPIC_ALERT_STATE": topics.alert_state,
        "IOTWATCH_TOPIC_SILENCES": topics.silences,
        "IOTWATCH_TOPIC_NOTIFICATIONS": topics.notifications,
    }
    result = CliRunner().invoke(
        cli,
        ["alerts", args[0], "--kafka", settings.kafka.bootstrap_servers, *args[1:]],
        env=env,
        catch_exceptions=refused,
    )
    if refused:
        assert result.exit_code != 0 and isinstance(result.exception, IotwatchError), result.output
    return result


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_ack_list_and_silence_are_records_that_fold_back(test_settings: Settings) -> None:
    leak = make_alert("leak-1", "leak_sensor", "home-1", "water_leak", "critical", "raised", 1_000)
    hvac = make_alert("hvac-1", "thermostat", "home-2", "stuck_hvac", "major", "raised", 2_000)
    old = make_alert("meter-1", "smart_meter", "home-1", "anomaly_score", "warning", "raised", 3_000)
    produce(
        test_settings.kafka,
        test_settings.topics.alerts,
        [leak, hvac, old, changed(old, state="cleared", detected_at_ms=old.detected_at_ms + 5000), b"{oops"],
    )
    warned = run(test_settings, "list")
    assert "skipped 1 record(s)" in warned.stderr and "3 alerts (open first" in warned.stdout

    listed = as_json(run(test_settings, "list", "--json"))
    assert (listed["total"], listed["shown"], listed["truncated"]) == (3, 3, False)
    assert [a["alert_id"] for a in listed["alerts"]] == [leak.alert_id, hvac.alert_id, old.alert_id]
    assert [a["status"] for a in listed["alerts"]] == ["open", "open", "cleared"]
    assert [a["alert_id"] for a in as_json(run(test_settings, "list", "--open", "--json"))["alerts"]] == [
        leak.alert_id,
        hvac.alert_id,
    ]
    assert [
        a["alert_id"]
        for a in as_json(run(test_settings, "list", "--site", "home-1", "--severity", "critical", "--json"))["alerts"]
    ] == [leak.alert_id]
    # a list that is cut says so, and how to see the rest
    cut = run(test_settings, "list", "--limit", "2")
    assert "2 of 3 alerts (open first, most severe first, newest first; --limit N or --all)" in cut.stdout
    cut_json = as_json(run(test_settings, "list", "--limit", "2", "--json"))
    assert (cut_json["total"], cut_json["shown"], cut_json["truncated"]) == (3, 2, True)
    assert as_json(run(test_settings, "list", "--limit", "1", "--all", "--json"))["shown"] == 3

    # acknowledge by a unique prefix; the table names who and why
    acked = as_json(
        run(test_settings, "ack", leak.alert_id[:8], "--by", "alice", "--note", "valve team called", "--json")
    )
    assert acked["status"] == "acknowledged" and acked["acked_by"] == "alice"
    table = run(test_settings, "list")
    assert table.exit_code == 0 and "alice" in table.stdout and "valve team called" in table.stdout
    # taken back and given again: the last action per alert is what counts (compaction keeps it)
    assert as_json(run(test_settings, "unack", leak.alert_id, "--by", "alice", "--json"))["status"] == "open"
    assert "not acknowledged" in str(run(test_settings, "unack", leak.alert_id, "--by", "x", refused=True).exception)
    assert (
        as_json(run(test_settings, "ack", leak.alert_id, "--by", "alice", "--note", "valve team called", "--json"))[
            "status"
        ]
        == "acknowledged"
    )
    state = read_topic(test_settings.kafka, test_settings.topics.alert_state, expected=3)
    record = decode(state[-1].value(), AlertState)
    assert {m.key() for m in state} == {leak.alert_id.encode()} and (record.by, record.note) == (
        "alice",
        "valve team called",
    )

    # the streaming job clears it afterwards: cleared after acknowledgement, with the times to both
    produce(
        test_settings.kafka,
        test_settings.topics.alerts,
        [changed(leak, state="cleared", detected_at_ms=record.at_ms + 60_000)],
    )
    view = load_book(test_settings).find(leak.alert_id)
    assert view.status == "cleared_after_ack" and view.seconds_to_clear() is not None
    assert view.seconds_to_ack() is not None and view.seconds_to_ack() <= view.seconds_to_clear()

    # what cannot be acknowledged is one line on stderr and a non-zero exit, nothing produced
    for alert_id, reason in (("0123456789abcdef01234567", "no alert with id"), (leak.alert_id, "already cleared")):
        assert reason in str(run(test_settings, "ack", alert_id, "--by", "bob", refused=True).exception)
    assert len(read_topic(test_settings.kafka, test_settings.topics.alert_state, idle_s=1.0)) == 3

    # silences: created, listed, shown against the alerts they mute, ended
    created = as_json(
        run(
            test_settings,
            "silence",
            "--site",
            "home-2",
            "--rule",
            "stuck_hvac",
            "--for",
            "2h",
            "--comment",
            "HVAC engineer on site",
            "--by",
            "carol",
            "--json",
        )
    )
    assert created["ends_at_ms"] - created["starts_at_ms"] == 7_200_000
    assert [s["silence_id"] for s in as_json(run(test_settings, "silences", "--json"))] == [created["silence_id"]]
    assert created["silence_id"] in run(test_settings, "list", "--open").stdout
    ended = as_json(run(test_settings, "unsilence", created["silence_id"], "--by", "carol", "--json"))
    assert ended["revoked_by"] == "carol" and ended["ends_at_ms"] <= ended["starts_at_ms"] + 60_000
    assert as_json(run(test_settings, "silences", "--json")) == []
    assert len(as_json(run(test_settings, "silences", "--all", "--json"))) == 1
    records = read_topic(test_settings.kafka, test_settings.topics.silences, expected=2)
    assert {m.key() for m in records} == {created["silence_id"].encode()}  # one key: compaction keeps the last
    assert decode(records[-1].value(), Silence).revoked_by == "carol"
    assert "at least one of" in str(run(test_settings, "silence", "--for", "1h", refused=True).exception)
    assert "no silence" in str(run(test_settings, "unsilence", "nope", refused=True).exception)
