"""The ``iotwatch`` program: the frame every command hangs from, loaded on demand (docs/internals.md,
"The root command")."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from iotwatch.cli import AppContext, LazyGroup
from iotwatch.errors import IotwatchError

#: Sub-command name -> "module:attribute" of its click command. Modules are imported
#: only when their command runs, so ``iotwatch --help`` does not pay for Spark's import;
#: the names are literal, and tests/unit/repo/test_layers.py reads them as imports.
SUBCOMMANDS: dict[str, str] = {
    "score-csv": "iotwatch.evaluation.score_csv_cli:score_csv",
    "evaluate": "iotwatch.evaluation.cli:evaluate",
    "train": "iotwatch.models.cli:train",
    "setup": "iotwatch.application.setup_cli:setup",
    "stack": "iotwatch.application.stack.cli:stack",
    "gateway": "iotwatch.gateway.cli:gateway",
    "stream": "iotwatch.streaming.cli:stream",
    "replay": "iotwatch.streaming.replay_cli:replay",
    "archive": "iotwatch.streaming.archive_cli:archive",
    "demo": "iotwatch.application.demo.cli:demo",
    "chaos": "iotwatch.application.chaos.cli:chaos",
    "bench": "iotwatch.application.bench.cli:bench",
    "simulate": "iotwatch.devices.cli:simulate",
    "dashboards": "iotwatch.dashboards.cli:dashboards",
    "alerts": "iotwatch.alerts.cli:alerts",
    "provision": "iotwatch.application.provision.cli:provision",
    "respond": "iotwatch.responder.cli:respond",
    "relay": "iotwatch.responder.cli:relay",
    "commands": "iotwatch.responder.cli:commands",
    "devices": "iotwatch.responder.twin_cli:devices",
    "deadletters": "iotwatch.application.dead_letters_cli:deadletters",
}


class _Commands(LazyGroup):
    registry = SUBCOMMANDS


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML settings file ([mqtt], [kafka], [topics], [influx], [stack] tables); "
    "also IOTWATCH_CONFIG. Environment variables IOTWATCH_* take precedence over it.",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Logging threshold for messages on stderr.",
)
@click.version_option(package_name="iotwatch")
@click.pass_context
def cli(ctx: click.Context, config_file: Path | None, log_level: str) -> None:
    """iotwatch: IoT telemetry ingestion and anomaly detection.

    Devices publish over MQTT, a gateway bridges to Kafka, a PySpark Structured Streaming
    job cleans, scores and alerts, and metrics go to InfluxDB for Grafana.
    """
    from iotwatch.logs import configure

    configure(log_level)
    ctx.obj = AppContext(config_file)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: one-line errors, meaningful exit codes."""
    try:
        cli.main(args=argv, prog_name="iotwatch", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        click.echo("iotwatch: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"iotwatch: error: {_one_line(exc.format_message())}", err=True)
        sys.exit(exc.exit_code)
    except (IotwatchError, OSError) as exc:
        logging.getLogger("iotwatch").debug("error", exc_info=True)
        click.echo(f"iotwatch: error: {_one_line(str(exc))}", err=True)
        sys.exit(1)
    except Exception as exc:
        # not a mistake of the user's or a service that did not answer: a bug
        logging.getLogger("iotwatch").debug("internal error", exc_info=True)
        click.echo(
            f"iotwatch: internal error: {type(exc).__name__}: {_one_line(str(exc))} "
            "(--log-level debug shows the traceback)",
            err=True,
        )
        sys.exit(1)


def _one_line(text: str) -> str:
    return " ".join(text.split())
