"""Device commands as InfluxDB points: the ``Commands`` annotations of the device drill-down.

``commands`` (tags site, device_type, device_id, name, status; fields ``text``, ``command_id``,
``attempt``): one point per step of a command's audit trail (sent, accepted, done, ...), at
the step's time plus a per-command offset in nanoseconds, so a rewrite after a restart
overwrites and two commands in one millisecond stay two points.
"""

from __future__ import annotations

import logging

from influxdb_client import Point

from iotwatch.clients.influx import InfluxV1Client, event_time_ns
from iotwatch.contract.measurements import COMMANDS
from iotwatch.contract.oncall import CommandAudit
from iotwatch.errors import ServiceUnavailable

log = logging.getLogger(__name__)


def command_point(audit: CommandAudit) -> Point:
    """The point of the audit's latest step."""
    step = audit.history[-1] if audit.history else None
    at_ms = step.at_ms if step else audit.issued_at_ms
    text = f"{audit.name} {audit.status.value} (attempt {audit.attempt}, {audit.issued_by}, rule {audit.rule})"
    if step is not None and step.reason and step.status.value != "sent":
        text += f": {step.reason}"
    return COMMANDS.point(
        {
            "site": audit.site,
            "device_type": audit.device_type,
            "device_id": audit.device_id,
            "name": audit.name,
            "status": audit.status.value,
        },
        {"text": text, "command_id": audit.command_id, "attempt": audit.attempt},
        event_time_ns(at_ms, audit.command_id),
        "ns",
    )


def write_command(client: InfluxV1Client, audit: CommandAudit) -> bool:
    """Write one step; False (logged) when InfluxDB is unreachable: the audit topic has it anyway."""
    try:
        client.write_points([command_point(audit)], precision="ns")
        return True
    except ServiceUnavailable as exc:
        log.warning("InfluxDB: command point not written: %s", exc)
        return False
