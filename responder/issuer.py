"""The responder's MQTT session: publishes commands at QoS 1, receives the devices' replies.

A persistent session with a fixed client id: replies (and twin reports) sent while the responder is down wait
at the broker. Commands go to each device's own topic; the broker keeps them for a device's
persistent session while it is offline (the device rejects them if they expired by then).
"""

from __future__ import annotations

from iotwatch.clients.mqtt import PersistentSession
from iotwatch.contract.device_commands import Command, encode
from iotwatch.contract.device_topics import command_topic
from iotwatch.settings import MqttSettings

REPLY_FILTER = "iot/+/+/+/commands/ack"
#: Devices' reported twin properties (the responder records them in the twin topic).
TWIN_FILTER = "iot/+/+/+/twin/reported"


class CommandIssuer(PersistentSession):
    """``listen=False`` for an operator's one-off commands (no replies wanted)."""

    def __init__(self, settings: MqttSettings, client_id: str, *, listen: bool = True) -> None:
        super().__init__(settings, client_id, [REPLY_FILTER, TWIN_FILTER] if listen else [])

    def send(self, site: str, device_type: str, command: Command) -> None:
        """Publish at QoS 1 and wait for the broker's PUBACK (the broker has it, for the device)."""
        self.publish(command_topic(site, device_type, command.device_id), encode(command))
