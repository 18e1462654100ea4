"""How the responder reaches devices and hears their replies, by ``[respond] delivery``.

- ``mqtt`` (:class:`CommandIssuer`): one MQTT broker. Commands are published at QoS 1 to each
  device's own topic; the broker keeps them for a device's persistent session while it is
  offline (the device rejects them if they expired by then). A persistent session with a
  fixed client id: replies (and twin reports) sent while the responder is down wait at the broker.
- ``sites`` (:class:`SiteDelivery`): devices are at edge sites, each with its own broker. The
  ``sent`` audit record on the commands topic is the command: MirrorMaker 2 copies the
  commands topic to every site, where the site's relay (:mod:`iotwatch.responder.relay`) publishes it
  to its devices and writes their replies to the site's replies topic, which MirrorMaker
  copies back as ``<site>.<replies topic>``; this side reads those by pattern.
"""

from __future__ import annotations

import logging
from typing import Protocol

from confluent_kafka import Consumer

from iotwatch.clients.kafka import client_config
from iotwatch.clients.mqtt import PersistentSession
from iotwatch.contract.device_commands import COMMAND_SCHEMA_VERSION, Command, encode
from iotwatch.contract.device_topics import command_topic
from iotwatch.contract.oncall import CommandAudit
from iotwatch.settings import MqttSettings, Settings

log = logging.getLogger(__name__)

REPLY_FILTER = "iot/+/+/+/commands/ack"
#: Devices' reported twin properties (the responder records them in the twin topic).
TWIN_FILTER = "iot/+/+/+/twin/reported"


class Delivery(Protocol):
    """The responder's way to its devices."""

    def connect(self) -> None: ...

    def connected(self) -> bool: ...

    def send(self, site: str, device_type: str, command: Command) -> None: ...

    def replies(self) -> list[tuple[str, bytes]]:
        """Devices' replies (and twin reports) received since the last call: (MQTT topic, payload)."""
        ...

    def close(self) -> None: ...


def command_of(audit: CommandAudit) -> Command:
    """The command a ``sent`` audit record stands for (its reason is the ``sent`` step's)."""
    return Command(
        COMMAND_SCHEMA_VERSION,
        audit.command_id,
        audit.device_id,
        audit.name,
        audit.issued_at_ms,
        audit.expires_at_ms,
        audit.issued_by,
        audit.args,
        audit.history[0].reason if audit.history else None,
    )


class CommandIssuer(PersistentSession):
    """``listen=False`` for an operator's one-off commands (no replies wanted)."""

    def __init__(self, settings: MqttSettings, client_id: str, *, listen: bool = True) -> None:
        super().__init__(settings, client_id, [REPLY_FILTER, TWIN_FILTER] if listen else [])

    def send(self, site: str, device_type: str, command: Command) -> None:
        """Publish at QoS 1 and wait for the broker's PUBACK (the broker has it, for the device)."""
        self.publish(command_topic(site, device_type, command.device_id), encode(command))

    def replies(self) -> list[tuple[str, bytes]]:
        out = []
        while not self.received.empty():
            out.append(self.received.get_nowait())
        return out


class SiteDelivery:
    """The centre's side of commands to sites: sending is writing the audit record (the
    responder does that next), replies are read from every site's replica of the replies topic.

    The replies are read in a consumer group (the responder's client id) whose offsets are
    committed automatically: a reply is handled before the next poll commits past it, and one
    handled again after a restart is a late reply to the audit trail, recorded once."""

    def __init__(self, settings: Settings) -> None:
        topics = settings.topics
        self._consumer = Consumer(
            {
                **client_config(settings.kafka),
                "group.id": f"{settings.respond.client_id}-replies",
                "auto.offset.reset": "earliest",
                # a new site's replica is subscribed to within seconds, not the default 5 minutes
                "topic.metadata.refresh.interval.ms": 5000,
            }
        )
        self._pattern = f"^{topics.site_replicas(topics.replies)}$"

    def connect(self) -> None:
        self._consumer.subscribe([self._pattern])

    def connected(self) -> bool:
        return True  # the audit record goes to Kafka, which the responder writes to in any case

    def send(self, site: str, device_type: str, command: Command) -> None:
        """Nothing to do here: the ``sent`` audit record the responder writes is the command."""

    def replies(self) -> list[tuple[str, bytes]]:
        out = []
        for message in self._consumer.consume(1000, 0.0):
            key = message.key()  # the relay keys every reply by its MQTT topic
            if message.error() is not None:
                log.warning("respond: reading the sites' replies: %s", message.error())
            elif key is None:
                log.error("respond: a reply without its MQTT topic at %s@%d", message.topic(), message.offset())
            else:
                out.append((key.decode(errors="replace"), message.value() or b""))
        return out

    def close(self) -> None:
        self._consumer.close()
