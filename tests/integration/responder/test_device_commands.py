"""Commands to simulated devices over the real broker: obeyed, expired ones refused, a device
that was offline gets its commands when it reconnects (persistent session) or they expire."""

from __future__ import annotations

import time
from pathlib import Path

from iotwatch.devices.home.contact import LEAK as LEAK_MODE
from iotwatch.devices.home.thermostat import HVAC_STUCK
from iotwatch.responder.issuer import CommandIssuer
from iotwatch.settings import Settings
from tests.helpers import wait_for as eventually
from tests.support.homes import LEAK, SITE, THERMOSTAT, Obeying, Replies, command, home_with_faults, mode


def test_devices_obey_refuse_expired_and_get_commands_sent_while_offline(
    stack_settings: Settings, unique: str, tmp_path: Path, replies: Replies
) -> None:
    sim = home_with_faults(tmp_path)
    assert mode(sim, THERMOSTAT) == HVAC_STUCK and mode(sim, LEAK) == LEAK_MODE
    issuer = CommandIssuer(stack_settings.mqtt, f"operator-{unique}", listen=False)
    issuer.connect()
    devices = Obeying(sim, stack_settings.mqtt, f"sim-{unique}")
    try:
        # an expired command is refused and not executed; a valid one is accepted, done, and ends the fault
        stale = command(THERMOSTAT, "reset_hvac", ttl_s=-1)
        issuer.send(SITE, "thermostat", stale)
        eventually(lambda: replies.of(stale.command_id) == ["rejected:expired"], 10, "the expired command refused")
        assert mode(sim, THERMOSTAT) == HVAC_STUCK
        reset = command(THERMOSTAT, "reset_hvac")
        issuer.send(SITE, "thermostat", reset)
        eventually(lambda: replies.of(reset.command_id) == ["accepted", "done"], 10, "reset accepted and done")
        assert mode(sim, THERMOSTAT) == 0
        truth = [r for r in sim.injector.records if r.kind == "stuck_hvac"]
        assert truth and truth[0].ended_by_command == reset.command_id
        # delivered again (QoS 1 redelivery or a re-send): answered again, not run again
        issuer.send(SITE, "thermostat", reset)
        eventually(lambda: replies.of(reset.command_id) == ["accepted", "done", "done"], 10, "the repeat answered")
        # what a device cannot do, and what is not a command
        odd = command(LEAK, "reset_hvac")
        issuer.send(SITE, "leak_sensor", odd)
        eventually(
            lambda: replies.of(odd.command_id) == ["accepted", "rejected:leak_sensor does not support reset_hvac"],
            10,
            "unsupported refused",
        )
        issuer.client.publish(f"iot/{SITE}/leak_sensor/{LEAK}/commands", b"{not json", qos=1).wait_for_publish(5)
        eventually(lambda: devices.handler.counts.get("malformed") == 1, 10, "the malformed command counted")
    finally:
        devices.close()  # offline; the broker keeps its session

    valve = command(LEAK, "close_valve", ttl_s=60)
    short = command(LEAK, "close_valve", ttl_s=1)
    issuer.send(SITE, "leak_sensor", valve)
    issuer.send(SITE, "leak_sensor", short)
    time.sleep(1.5)
    assert replies.of(valve.command_id) == [] and mode(sim, LEAK) == LEAK_MODE
    devices = Obeying(sim, stack_settings.mqtt, f"sim-{unique}")  # back online, same session
    try:
        eventually(lambda: replies.of(valve.command_id) == ["accepted", "done"], 15, "the queued command done")
        eventually(lambda: replies.of(short.command_id) == ["rejected:expired"], 15, "the queued one expired")
        assert mode(sim, LEAK) == 0
        assert devices.handler.counts == {"accepted": 1, "done": 1, "rejected": 1, "expired": 1}
    finally:
        devices.close()
        issuer.close()
