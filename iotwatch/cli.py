"""What every ``iotwatch`` command is built from: settings, shared options, output, signals.

The stages' commands (``gateway/cli.py``, ``alerts/cli.py``, ...) build on this module, and the
frame that registers them (:mod:`iotwatch.app`) sits above every stage, so a stage's command
imports the core and its own stage only. Conventions every command keeps (scripts and tests
rely on them):

- ``--mqtt mqtt://HOST:PORT``, ``--kafka HOST:PORT`` and ``--influx http://HOST:PORT``
  override the settings for the services the command talks to (:func:`endpoint_options`);
- ``--json`` prints one machine-readable JSON document as the last thing on stdout
  (:func:`emit`);
- an error is one line on stderr (``iotwatch: error: ...``) and a non-zero exit status
  (:func:`iotwatch.app.main`).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from iotwatch.settings import Settings, load_settings

if TYPE_CHECKING:
    from rich.console import Console

F = TypeVar("F", bound=Callable[..., Any])


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


def stop_on_signals() -> threading.Event:
    """SIGTERM and Ctrl-C end a command's loop at the next safe point instead of killing it mid-post."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop
