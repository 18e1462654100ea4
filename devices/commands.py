"""The simulated devices' side of the closed loop: receive commands, obey, reply (docs/internals.md,
"Commands")."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from typing import Any

from iotwatch.clients.mqtt import PersistentSession
from iotwatch.contract.device_commands import (
    COMMAND_SCHEMA_VERSION,
    CommandReply,
    CommandStatus,
    TwinProperties,
    TwinReport,
    decode_command,
    encode,
)
from iotwatch.contract.device_topics import command_ack_topic, command_topic, parse_device_topic, twin_reported_topic
from iotwatch.contract.telemetry import ContractViolation
from iotwatch.settings import MqttSettings

log = logging.getLogger(__name__)

#: The reason of a command rejected because it arrived after its expiry (never executed).
EXPIRED = "expired"
#: Obeys a command: (device id, command name, command id, args) -> None when done, else why not.
Obey = Callable[[str, str, str, dict[str, Any]], str | None]
#: What a device reports of its twin (None: not one of these devices).
Reported = Callable[[str], TwinProperties | None]


class CommandChannel(PersistentSession):
    """The MQTT session that carries the commands of a set of devices (site, type, id)."""

    def __init__(self, settings: MqttSettings, client_id: str, devices: list[tuple[str, str, str]]) -> None:
        super().__init__(settings, client_id, [command_topic(*device) for device in devices])
        self.devices = devices

    def reply(self, site: str, device_type: str, reply: CommandReply) -> None:
        self.client.publish(command_ack_topic(site, device_type, reply.device_id), encode(reply), qos=1)

    def report(self, site: str, device_type: str, report: TwinReport) -> None:
        """The device's twin properties, retained: a subscriber that comes later gets the latest."""
        self.client.publish(
            twin_reported_topic(site, device_type, report.device_id), encode(report), qos=1, retain=True
        )


class DeviceCommands:
    """Turns received commands into actions on the simulation and replies."""

    def __init__(
        self,
        channel: CommandChannel,
        obey: Obey,
        clock: Callable[[], float] = time.time,
        reported: Reported | None = None,
    ) -> None:
        self.channel, self.obey, self.clock, self.reported = channel, obey, clock, reported
        self.answered: dict[str, CommandReply] = {}  # command id -> final reply
        self.counts: dict[str, int] = {}

    def handle_pending(self) -> None:
        """Handle every command received since the last call (the simulation's thread calls this)."""
        while True:
            try:
                topic, payload = self.channel.received.get_nowait()
            except queue.Empty:
                return
            self.handle(topic, payload)

    def handle(self, topic: str, payload: bytes) -> None:
        try:
            site, device_type, device_id, _ = parse_device_topic(topic)
            command = decode_command(payload)
        except ContractViolation as exc:
            self._count("malformed")
            log.warning("ignored a command on %s that is not one (%s)", topic, exc)
            return
        if command.command_id in self.answered:  # delivered again: answer again, do not run again
            self.channel.reply(site, device_type, self.answered[command.command_id])
            self._count("repeated")
            return
        now = int(self.clock() * 1000)
        if command.device_id != device_id:
            final = self._reply(
                command.command_id,
                device_id,
                CommandStatus.REJECTED,
                now,
                f"command for {command.device_id} on {device_id}'s topic",
            )
        elif command.expired(now):
            final = self._reply(command.command_id, device_id, CommandStatus.REJECTED, now, EXPIRED)
            self._count(EXPIRED)
        else:
            self.channel.reply(
                site, device_type, self._reply(command.command_id, device_id, CommandStatus.ACCEPTED, now)
            )
            self._count(CommandStatus.ACCEPTED.value)
            refused = self.obey(device_id, command.name, command.command_id, command.args)
            final = self._reply(
                command.command_id,
                device_id,
                CommandStatus.DONE if refused is None else CommandStatus.REJECTED,
                int(self.clock() * 1000),
                refused,
            )
        self.answered[command.command_id] = final
        self.channel.reply(site, device_type, final)
        self._count(final.status.value)
        if final.status == CommandStatus.DONE:
            self.report(site, device_type, device_id)

    def report(self, site: str, device_type: str, device_id: str) -> None:
        """Publish what the device reports of its twin (nothing without ``reported``)."""
        properties = None if self.reported is None else self.reported(device_id)
        if properties is not None:
            report = TwinReport(COMMAND_SCHEMA_VERSION, device_id, int(self.clock() * 1000), properties)
            self.channel.report(site, device_type, report)

    def report_all(self) -> None:
        """Every device of the channel reports its twin (at start)."""
        for site, device_type, device_id in self.channel.devices:
            self.report(site, device_type, device_id)

    @staticmethod
    def _reply(
        command_id: str, device_id: str, status: CommandStatus, at_ms: int, reason: str | None = None
    ) -> CommandReply:
        return CommandReply(COMMAND_SCHEMA_VERSION, command_id, device_id, status, at_ms, reason)

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1
        log.info("command %s", name)
