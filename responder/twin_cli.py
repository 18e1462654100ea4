"""``iotwatch devices show|set``: operators read and change device twins."""

from __future__ import annotations

from typing import Any

import click

from iotwatch.cli import AppContext, emit, endpoint_options, json_option, output_console, pass_app
from iotwatch.settings import user_name


@click.group()
def devices() -> None:
    """Device twins: desired and reported properties (setpoint_c, valve, limp_mode, firmware)."""


@devices.command()
@click.argument("device_id")
@endpoint_options(mqtt=True, kafka=True)
@json_option
@pass_app
def show(app: AppContext, device_id: str, as_json: bool) -> None:
    """A device's twin: per property what operators want, what the device reports, and whether
    they agree; and its connection, from its retained status: online, offline (it said goodbye:
    no silence alert) or lost (its last will: silent)."""
    from iotwatch.errors import IotwatchError
    from iotwatch.responder.twin_ops import read_connection, read_twin

    twin = read_twin(app.settings, device_id)
    if twin.desired is None and twin.reported is None:
        raise IotwatchError(f"no twin for device {device_id} (it never reported and nobody set one)")
    emit({**twin.as_dict(), "connection": read_connection(app.settings, twin)}, as_json, _render)


@devices.command(name="set")
@click.argument("device_id")
@click.argument("assignments", nargs=-1, required=True, metavar="KEY=VALUE...")
@click.option("--by", default=user_name, show_default="your user name", help="Who sets it (the audit trail).")
@click.option(
    "--ttl",
    "ttl",
    default="10m",
    show_default=True,
    help="The device must get the change within this (an offline device: when it reconnects).",
)
@click.option("--site", help="The device's site, when it never reported its twin.")
@click.option("--type", "device_type", help="The device's type, when it never reported its twin.")
@endpoint_options(mqtt=True, kafka=True)
@json_option
@pass_app
def set_(
    app: AppContext,
    device_id: str,
    assignments: tuple[str, ...],
    by: str,
    ttl: str,
    site: str | None,
    device_type: str | None,
    as_json: bool,
) -> None:
    """Set desired properties (e.g. setpoint_c=19.5, valve=closed, limp_mode=true) and send them to the device."""
    from iotwatch.alerts.records import parse_duration
    from iotwatch.responder.twin_ops import parse_assignments, set_desired

    try:
        ttl_s = parse_duration(ttl)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--ttl") from None
    record, command = set_desired(app.settings, device_id, parse_assignments(assignments), by, ttl_s, site, device_type)
    emit(
        {
            "device_id": device_id,
            "version": record.version,
            "desired": record.properties.as_dict(),
            "command_id": command.command_id,
            "sent": command.args,
        },
        as_json,
        lambda r: click.echo(
            f"{device_id}: desired version {r['version']} "
            f"{' '.join(f'{k}={_text(v)}' for k, v in r['sent'].items())} sent as command "
            f"{r['command_id'][:12]} (iotwatch devices show {device_id})"
        ),
    )


def _render(twin: dict[str, Any]) -> None:
    from rich.table import Table

    out = output_console()
    desired, reported = twin["desired"], twin["reported"]
    known = reported or desired
    out.print(f"{twin['device_id']} ({known['device_type']} at {known['site']})")
    table = Table(pad_edge=False, box=None, header_style="bold")
    for name in ("property", "desired", "reported", "state"):
        table.add_column(name)
    for row in twin["properties"]:
        table.add_row(row["property"], _text(row["desired"]), _text(row["reported"]), row["state"])
    out.print(table)
    if desired:
        out.print(f"desired version {desired['version']} by {desired['by']}", style="dim")
    out.print("reported " + ("never" if not reported else f"by the device at {_when(reported['at_ms'])}"), style="dim")
    connection = twin.get("connection") or {}
    state = connection.get("state") or "unknown"
    since = f" since {_when(connection['ts'])}" if connection.get("ts") else ""
    out.print(f"connection {state}{since}" + (f" ({connection['detail']})" if connection.get("detail") else ""))


def _text(value: Any) -> str:
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _when(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
