"""The ``iotwatch`` command line: one frame, sub-commands loaded on demand.

Conventions every sub-command keeps (scripts and tests rely on them):

- ``--mqtt mqtt://HOST:PORT``, ``--kafka HOST:PORT`` and ``--influx http://HOST:PORT``
  override the settings for the services the command talks to (:func:`endpoint_options`);
- ``--json`` prints one machine-readable JSON document as the last thing on stdout
  (:func:`emit`);
- an error is one line on stderr (``iotwatch: error: ...``) and a non-zero exit status.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from iotwatch.errors import IotwatchError

if TYPE_CHECKING:
    from rich.console import Console
from iotwatch.settings import Settings, load_settings

F = TypeVar("F", bound=Callable[..., Any])

#: Sub-command name -> "module:attribute" of its click command. Modules are imported
#: only when their command runs, so ``iotwatch --help`` does not pay for Spark's import.
SUBCOMMANDS: dict[str, str] = {
    "score-csv": "models.cli.score_csv:score_csv",
    "evaluate": "models.cli.evaluate:evaluate",
    "train": "models.cli.train:train",
    "setup": "iotwatch.cli.setup:setup",
    "stack": "iotwatch.cli.stack:stack",
    "gateway": "gateway.cli:gateway",
    "stream": "streaming.cli:stream",
    "replay": "streaming.replay:replay",
    "demo": "iotwatch.cli.demo:demo",
    "chaos": "iotwatch.cli.chaos:chaos",
    "bench": "iotwatch.cli.bench:bench",
    "simulate": "devices.cli:simulate",
    "dashboards": "dashboards.cli:dashboards",
    "alerts": "alerts.cli:alerts",
    "provision": "iotwatch.cli.provision:provision",
    "respond": "responder.cli:respond",
    "commands": "responder.cli:commands",
    "devices": "devices.twin_cli:devices",
    "deadletters": "iotwatch.cli.deadletters:deadletters",
}


class LazyGroup(click.Group):
    """A group whose sub-commands (``registry``: name -> "module:attribute") are imported when used."""

    registry: dict[str, str] = SUBCOMMANDS

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.registry})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.registry:
            module_name, attribute = self.registry[cmd_name].split(":")
            return getattr(importlib.import_module(module_name), attribute)
        return super().get_command(ctx, cmd_name)


class AppContext:
    """Per-invocation state handed to sub-commands: settings with overrides applied."""

    def __init__(self, config_file: Path | None) -> None:
        self.config_file = config_file
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.config_file)
        return self._settings

    def override_endpoints(self, mqtt: str | None = None, kafka: str | None = None, influx: str | None = None) -> None:
        self._settings = self.settings.with_endpoints(mqtt=mqtt, kafka=kafka, influx=influx)


pass_app = click.make_pass_decorator(AppContext)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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


def endpoint_options(*, mqtt: bool = False, kafka: bool = False, influx: bool = False) -> Callable[[F], F]:
    """Add the shared ``--mqtt/--kafka/--influx`` overrides for the services a command uses."""

    def decorate(func: F) -> F:
        def apply(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
            if value is not None:
                app = ctx.ensure_object(AppContext)
                try:
                    app.override_endpoints(**{param.name or "": value})
                except ValueError as exc:
                    raise click.BadParameter(str(exc)) from None
            return value

        options = []
        if mqtt:
            options.append(
                click.option(
                    "--mqtt",
                    metavar="mqtt://HOST:PORT",
                    expose_value=False,
                    callback=apply,
                    help="MQTT broker (overrides IOTWATCH_MQTT_URL).",
                )
            )
        if kafka:
            options.append(
                click.option(
                    "--kafka",
                    metavar="HOST:PORT",
                    expose_value=False,
                    callback=apply,
                    help="Kafka bootstrap servers (overrides IOTWATCH_KAFKA_BOOTSTRAP_SERVERS).",
                )
            )
        if influx:
            options.append(
                click.option(
                    "--influx",
                    metavar="http://HOST:PORT",
                    expose_value=False,
                    callback=apply,
                    help="InfluxDB URL, '' to disable (overrides IOTWATCH_INFLUX_URL).",
                )
            )
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print a machine-readable JSON result as the last thing on stdout."
)


#: Width of output that is not a terminal: wide enough that no table is cut (a table only
#: takes the width its cells need), so a pipe, a file or ``less -S`` gets whole rows.
PIPED_WIDTH = 1000


def output_console(*, stderr: bool = False) -> Console:
    """Where a command prints tables: the terminal's width on a terminal, else
    :data:`PIPED_WIDTH` (rich would otherwise cut every table to 80 columns)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, highlight=False, width=None if stream.isatty() else PIPED_WIDTH)


def emit(result: Any, as_json: bool, render: Callable[[Any], None] | None = None) -> None:
    """Print a command's result: JSON on stdout with ``--json``, else the human rendering."""
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
    elif render is not None:
        render(result)
    else:
        click.echo(json.dumps(result, indent=2, default=str))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: one-line errors, meaningful exit codes."""
    try:
        cli.main(args=argv, prog_name="iotwatch", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("iotwatch: interrupted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
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
