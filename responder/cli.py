"""``iotwatch respond``: run the responder (alerts -> corrective device commands)."""

from __future__ import annotations

from pathlib import Path

import click

from iotwatch.cli import AppContext, emit, endpoint_options, json_option, pass_app


@click.command()
@endpoint_options(mqtt=True, kafka=True)
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Policy file (TOML, see responder/policy.py; default IOTWATCH_RESPOND_POLICY_FILE, else the "
                   "built-in: stuck_hvac -> reset_hvac, water_leak -> close_valve).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), help="Stop after this many seconds.")
@json_option
@pass_app
def respond(app: AppContext, policy_file: Path | None, timeout_s: float | None, as_json: bool) -> None:
    """Send corrective commands to devices for firing alerts, per a policy; follow the devices'
    replies, retry, escalate, and keep the audit trail on the commands topic. Stop with SIGTERM or Ctrl-C."""
    from alerts.cli import _stop_on_signals
    from responder.policy import load_policies
    from responder.service import Responder

    policies = load_policies(policy_file or app.settings.respond.policy_file)
    counts = Responder(app.settings, policies, _stop_on_signals()).run(timeout_s)
    emit(counts, as_json, lambda c: click.echo(
        "respond: " + (", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(c.items())) or "nothing to do")))
