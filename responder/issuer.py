"""The responder's MQTT session: publishes commands at QoS 1, receives the devices' replies.

A fixed client id with clean session off: replies sent while the responder is down wait at
the broker. Commands are published to each device's own topic; the broker keeps them for a
device's persistent session while it is offline (the device rejects them if they expired).
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import paho.mqtt.client as paho

from iotwatch.clients.mqtt import make_client
from iotwatch.contract import Command, command_topic, encode
from iotwatch.errors import ServiceUnavailable
from iotwatch.settings import MqttSettings

REPLY_FILTER = "iot/+/+/+/commands/ack"


class CommandIssuer:
    def __init__(self, settings: MqttSettings, client_id: str, *, listen: bool = True) -> None:
        self.settings, self.listen = settings, listen
        self.replies: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self._ready = threading.Event()
        self._refused: str | None = None
        self.client = make_client(settings, client_id, clean_session=False)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *_: self._ready.set()
        self.client.on_message = lambda _c, _u, m: self.replies.put((m.topic, m.payload))

    def _on_connect(self, client: paho.Client, _u: Any, _flags: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            self._refused = str(reason)
            self._ready.set()
        elif self.listen:
            client.subscribe(REPLY_FILTER, qos=1)
        else:
            self._ready.set()

    def connect(self, timeout_s: float = 15.0) -> None:
        try:
            self.client.connect(self.settings.host, self.settings.port, keepalive=self.settings.keepalive_s)
        except OSError as exc:
            raise ServiceUnavailable(f"MQTT broker {self.settings.url} refused the connection: {exc}") from exc
        self.client.loop_start()
        if not self._ready.wait(timeout_s) or self._refused:
            self.close()
            raise ServiceUnavailable(f"MQTT broker {self.settings.url}: {self._refused or 'no answer'}")

    def send(self, site: str, device_type: str, command: Command, timeout_s: float = 15.0) -> None:
        """Publish at QoS 1 and wait for the broker's PUBACK (the broker has it, for the device)."""
        info = self.client.publish(command_topic(site, device_type, command.device_id), encode(command), qos=1)
        info.wait_for_publish(timeout_s)
        if not info.is_published():
            raise ServiceUnavailable(f"MQTT broker {self.settings.url} did not acknowledge command "
                                     f"{command.command_id}")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
