"""``iotwatch respond``: run the responder (alerts -> corrective device commands)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from iotwatch.cli import AppContext, emit, endpoint_options, json_option, output_console, pass_app, stop_on_signals

if TYPE_CHECKING:
    from iotwatch.contract.oncall import CommandAudit


_timeout_option = click.option(
    "--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), help="Stop after this many seconds."
)


def _counts_line(command: str, counts: dict[str, int]) -> None:
    """``respond: commands sent 2, ...``: the run's counters at exit, by name."""
    text = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(counts.items()))
    click.echo(f"{command}: {text or 'nothing to do'}")


@click.command()
@endpoint_options(mqtt=True, kafka=True)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Policy file (TOML, see docs/operate/oncall.md; default IOTWATCH_RESPOND_POLICY_FILE, else the "
    "built-in: stuck_hvac -> reset_hvac, water_leak -> close_valve, coolant_overheating -> limp_mode, "
    "crash -> emergency record).",
)
@_timeout_option
@json_option
@pass_app
def respond(app: AppContext, policy_file: Path | None, timeout_s: float | None, as_json: bool) -> None:
    """Send corrective commands to devices for firing alerts, per a policy; follow the devices'
    replies, retry, escalate, and keep the audit trail on the commands topic. Stop with SIGTERM or Ctrl-C."""
    from iotwatch.responder.policy import load_policies
    from iotwatch.responder.service import Responder

    policies = load_policies(policy_file or app.settings.respond.policy_file)
    counts = Responder(app.settings, policies, stop_on_signals()).run(timeout_s)
    emit(counts, as_json, lambda c: _counts_line("respond", c))


@click.command()
@endpoint_options(mqtt=True, kafka=True)
@_timeout_option
@json_option
@pass_app
def relay(app: AppContext, timeout_s: float | None, as_json: bool) -> None:
    """A site's end of device commands (with sites): publish the centre's commands from the
    site's replica of the commands topic to the site's devices over MQTT, write their replies to
    the site's replies topic (copied to the centre) and their twin reports to the site's twin
    topic. Run one per site against the site's Kafka and MQTT broker. Stop with SIGTERM or Ctrl-C."""
    from iotwatch.responder.relay import SiteRelay

    counts = SiteRelay(app.settings, stop_on_signals()).run(timeout_s)
    emit(counts, as_json, lambda c: _counts_line("relay", c))


@click.command()
@endpoint_options(kafka=True)
@click.option("--device", "devices", multiple=True, help="Only this device (repeatable).")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Rows shown at most.")
@click.option("--all", "show_all", is_flag=True, help="Every matching command (no --limit).")
@json_option
@pass_app
def commands(app: AppContext, devices: tuple[str, ...], limit: int, show_all: bool, as_json: bool) -> None:
    """The device commands' audit trail (the commands topic): newest first, with every reply and the outcome.
    The footer says how many of how many are shown; --json prints {"total", "shown", "truncated", "commands"}."""
    import msgspec

    from iotwatch.clients.kafka import read_to_end
    from iotwatch.contract.oncall import BadRecord, CommandAudit, decode

    latest: dict[str, CommandAudit] = {}
    for message in read_to_end(app.settings.kafka, app.settings.topics.commands):
        try:
            audit = decode(message.value(), CommandAudit)
        except BadRecord as exc:
            click.echo(
                f"iotwatch: warning: skipping a malformed audit record at offset {message.offset()}: {exc}", err=True
            )
            continue
        latest[audit.command_id] = audit
    matching = sorted(
        (a for a in latest.values() if not devices or a.device_id in devices), key=lambda a: -a.issued_at_ms
    )
    chosen = matching if show_all else matching[:limit]
    result = {
        "total": len(matching),
        "shown": len(chosen),
        "truncated": len(chosen) < len(matching),
        "commands": [msgspec.to_builtins(a) for a in chosen],
    }
    emit(result, as_json, lambda _: _commands_table(chosen, len(matching)))


def _commands_table(audits: list[CommandAudit], total: int) -> None:
    from rich.table import Table

    from iotwatch.alerts.views import shown_of

    table = Table(pad_edge=False, box=None, header_style="bold")
    for name in ("command", "device", "name", "attempt", "outcome", "trail", "alert"):
        table.add_column(name)
    for audit in audits:
        start = audit.issued_at_ms
        trail = " -> ".join(
            f"{s.status.value} +{(s.at_ms - start) / 1000:.1f}s"
            + (f" ({s.reason})" if s.reason and s.status.value != "sent" else "")
            for s in audit.history
        )
        table.add_row(
            audit.command_id[:12],
            audit.device_id,
            audit.name,
            str(audit.attempt),
            audit.status.value,
            trail,
            audit.alert_id[:12],
        )
    out = output_console()
    out.print(table)
    out.print(shown_of(len(audits), total, "commands", "newest first"), style="dim")
