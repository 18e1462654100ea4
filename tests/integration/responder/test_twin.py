"""Device twins against the real broker and MQTT: simulated devices report their properties,
the responder records them in the twin topic, an operator's ``devices set`` reaches the device
as a command, the device applies it (a closed valve stops the leak) and reports again, so
``devices show`` has both sides in sync; what a device lacks is refused and stays pending."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner

from iotwatch.alerts.actions import publish
from iotwatch.application.cli import cli
from iotwatch.clients.mqtt import make_client
from iotwatch.contract.device_commands import COMMAND_SCHEMA_VERSION, CommandReply, CommandStatus
from iotwatch.contract.device_topics import DeviceStatus, status_payload, status_topic
from iotwatch.contract.oncall import ONCALL_SCHEMA_VERSION, CommandAudit, CommandOutcome, encode
from iotwatch.responder.service import Responder
from iotwatch.responder.twin_ops import read_twin
from iotwatch.settings import Settings
from tests.helpers import InThread, wait_for
from tests.support.homes import LEAK, SITE, THERMOSTAT, Obeying, home_with_faults, mode


def iotwatch(settings: Settings, *args: str) -> dict:  # type: ignore[type-arg]
    result = CliRunner().invoke(
        cli,
        [*args, "--kafka", settings.kafka.bootstrap_servers, "--json"],
        env={f"IOTWATCH_TOPIC_{k.upper()}": v for k, v in settings.topics.model_dump().items() if isinstance(v, str)}
        | {"IOTWATCH_MQTT_URL": settings.mqtt.url},
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def retain(settings: Settings, topic: str, payload: bytes) -> None:
    """Publish ``payload`` as ``topic``'s retained message (QoS 1, acknowledged)."""
    client = make_client(settings.mqtt, f"retain-{time.monotonic_ns()}")
    client.connect(settings.mqtt.host, settings.mqtt.port)
    client.loop_start()
    try:
        client.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def test_twin_reported_set_applied_and_refused(test_settings: Settings, unique: str, tmp_path: Path) -> None:
    settings = test_settings.model_copy(
        update={"respond": test_settings.respond.model_copy(update={"client_id": f"responder-{unique}"})}
    )
    sim = home_with_faults(tmp_path)
    devices = Obeying(sim, settings.mqtt, f"sim-{unique}")
    running = InThread(lambda stop: Responder(settings, (), stop))  # no policies: only the twin and the replies
    try:
        wait_for(
            lambda: (
                read_twin(settings, LEAK).reported is not None and read_twin(settings, THERMOSTAT).reported is not None
            ),
            30,
            "both devices reported their twin",
        )
        before = read_twin(settings, LEAK)
        assert before.reported.properties.valve == "open" and before.desired is None  # type: ignore[union-attr]
        assert (before.reported.site, before.reported.device_type) == ("home-00000", "leak_sensor")  # type: ignore[union-attr]

        sent = iotwatch(settings, "devices", "set", LEAK, "valve=closed", "--by", "alice")
        assert sent["version"] == 1 and sent["desired"] == {"valve": "closed"}
        wait_for(
            lambda: (
                read_twin(settings, LEAK).rows()
                == [
                    {"property": "valve", "desired": "closed", "reported": "closed", "state": "in sync"},
                    {"property": "firmware", "desired": None, "reported": "1.0.0", "state": ""},
                ]
            ),
            30,
            "the valve closed",
        )
        assert mode(sim, LEAK) == 0  # the water stopped ...
        truth = [r for r in sim.injector.records if r.kind == "water_leak"]
        assert truth[0].ended_by_command == sent["command_id"]  # ... because of the operator's command

        status = status_topic(SITE, "thermostat", THERMOSTAT)
        retain(settings, status, b"")  # the session's broker may hold a status another test's device left
        shown = iotwatch(settings, "devices", "show", THERMOSTAT)
        assert shown["reported"]["properties"]["firmware"] == "1.0.0" and shown["desired"] is None
        assert shown["connection"]["state"] is None  # these devices keep no retained status
        retain(settings, status, status_payload(DeviceStatus.OFFLINE, 1_763_784_000_000))
        try:
            connection = iotwatch(settings, "devices", "show", THERMOSTAT)["connection"]
        finally:
            retain(settings, status, b"")  # a retained message is cleared by an empty one
        assert connection["state"] == "offline" and connection["ts"] == 1_763_784_000_000
        assert "no silence alert" in connection["detail"]
        iotwatch(settings, "devices", "set", THERMOSTAT, "setpoint_c=18.5", "firmware=1.1.0", "--by", "bob")
        wait_for(
            lambda: (
                {r["property"]: r["state"] for r in read_twin(settings, THERMOSTAT).rows()}
                == {"setpoint_c": "in sync", "firmware": "in sync"}
            ),
            30,
            "setpoint and firmware applied",
        )
        sim_thermostat = next(g for g in sim.groups if g.device_type == "thermostat")
        assert sim_thermostat.setpoint_override[0] == 18.5

        # a property the device does not have: refused by the device, recorded, still pending
        refused = iotwatch(settings, "devices", "set", THERMOSTAT, "limp_mode=true", "--by", "bob")
        wait_for(
            lambda: (
                running.service.audits.get(refused["command_id"]) is not None
                and running.service.audits[refused["command_id"]].status.value == "rejected"
            ),
            30,
            "the device refused limp mode, and the audit trail says so",
        )
        assert "thermostat has no limp_mode" in running.service.audits[refused["command_id"]].history[-1].reason  # type: ignore[operator]
        # a device may answer before the responder has read the command's audit record: the reply waits for it
        early = CommandAudit(
            ONCALL_SCHEMA_VERSION,
            "early-1",
            "operator-twin",
            "",
            "",
            LEAK,
            "leak_sensor",
            SITE,
            "set_properties",
            "bob",
            int(time.time() * 1000),
            int(time.time() * 1000) + 60_000,
            1,
            CommandOutcome.SENT,
        )
        reply = CommandReply(COMMAND_SCHEMA_VERSION, "early-1", LEAK, CommandStatus.DONE, int(time.time() * 1000))
        devices.channel.reply(SITE, "leak_sensor", reply)
        wait_for(lambda: running.service.waiting_replies == 1, 15, "the early reply held for its command")
        publish(settings, settings.topics.commands, "early-1", encode(early.with_step(CommandOutcome.SENT, 0)))
        wait_for(
            lambda: (
                running.service.audits.get("early-1") is not None
                and running.service.audits["early-1"].status.value == "done"
            ),
            15,
            "the early reply recorded",
        )
        twin = read_twin(settings, THERMOSTAT)
        assert twin.desired.version == 2  # versions count per device  # type: ignore[union-attr]
        assert {r["property"]: r["state"] for r in twin.rows()}["limp_mode"] == "pending"
    finally:
        counts = running.close()
        devices.close()
    assert counts["twin_reports"] >= 4 and not counts.get("dead_lettered")


def test_devices_set_refuses_bad_input(test_settings: Settings) -> None:
    runner = CliRunner()
    for args, said in ((["valve=ajar"], "valve"), (["colour=red"], "key one of"), (["setpoint_c=19"], "--site")):
        result = runner.invoke(
            cli,
            ["devices", "set", "nobody-1", *args, "--kafka", test_settings.kafka.bootstrap_servers],
            env={"IOTWATCH_TOPIC_DEVICE_TWIN": test_settings.topics.device_twin},
        )
        assert result.exit_code != 0 and said in result.output + str(result.exception), result.output
