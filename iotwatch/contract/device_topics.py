"""The MQTT topic layout of devices: where a device publishes and where it is told things.

``iot/<site>/<device_type>/<device_id>/<kind>``, kind one of ``telemetry``, ``status``
(retained online/offline/lost: :class:`DeviceStatus`), ``commands``, ``commands/ack`` and ``twin/reported``.
"""

from __future__ import annotations

import json
from enum import StrEnum

from iotwatch.contract.telemetry import SCHEMA_VERSION, ContractViolation

# --- MQTT topics ---------------------------------------------------------------------

TELEMETRY_SUFFIX = "telemetry"
STATUS_SUFFIX = "status"
#: Device commands go to ``.../commands``; the device answers on ``.../commands/ack``.
COMMANDS_SUFFIX = "commands"
COMMAND_ACK_SUFFIX = "commands/ack"
#: A device's reported twin properties (retained, QoS 1): ``.../twin/reported``.
TWIN_REPORTED_SUFFIX = "twin/reported"


def telemetry_topic(site: str, device_type: str, device_id: str) -> str:
    return f"iot/{site}/{device_type}/{device_id}/{TELEMETRY_SUFFIX}"


def status_topic(site: str, device_type: str, device_id: str) -> str:
    return f"iot/{site}/{device_type}/{device_id}/{STATUS_SUFFIX}"


def command_topic(site: str, device_type: str, device_id: str) -> str:
    return f"iot/{site}/{device_type}/{device_id}/{COMMANDS_SUFFIX}"


def command_ack_topic(site: str, device_type: str, device_id: str) -> str:
    return f"iot/{site}/{device_type}/{device_id}/{COMMAND_ACK_SUFFIX}"


def twin_reported_topic(site: str, device_type: str, device_id: str) -> str:
    return f"iot/{site}/{device_type}/{device_id}/{TWIN_REPORTED_SUFFIX}"


def parse_device_topic(topic: str) -> tuple[str, str, str, str]:
    """``iot/<site>/<type>/<id>/<kind>`` -> (site, device_type, device_id, kind)."""
    parts = topic.split("/")
    if len(parts) != 5 or parts[0] != "iot" or not all(parts):
        raise ContractViolation("bad_topic", f"{topic!r} is not iot/<site>/<device_type>/<device_id>/<kind>")
    return parts[1], parts[2], parts[3], parts[4]


class DeviceStatus(StrEnum):
    """The ``state`` of a device's retained status: ``online`` once connected, ``offline``
    when it stops cleanly (its goodbye), ``lost`` when its connection ended without one (the
    MQTT last will, which the broker publishes for it)."""

    ONLINE = "online"
    OFFLINE = "offline"
    LOST = "lost"


def status_payload(state: DeviceStatus, ts_ms: int) -> bytes:
    """The retained status message (``lost``: the MQTT last will)."""
    return json.dumps({"v": SCHEMA_VERSION, "state": str(state), "ts": ts_ms}).encode()


def parse_command_ack_topic(topic: str) -> tuple[str, str, str]:
    """``iot/<site>/<type>/<id>/commands/ack`` -> (site, device_type, device_id)."""
    return _parse_suffixed(topic, COMMAND_ACK_SUFFIX)


def parse_twin_reported_topic(topic: str) -> tuple[str, str, str]:
    """``iot/<site>/<type>/<id>/twin/reported`` -> (site, device_type, device_id)."""
    return _parse_suffixed(topic, TWIN_REPORTED_SUFFIX)


def _parse_suffixed(topic: str, suffix: str) -> tuple[str, str, str]:
    parts, tail = topic.split("/"), suffix.split("/")
    if len(parts) != 4 + len(tail) or parts[0] != "iot" or parts[4:] != tail or not all(parts):
        raise ContractViolation("bad_topic", f"{topic!r} is not iot/<site>/<device_type>/<device_id>/{suffix}")
    return parts[1], parts[2], parts[3]
