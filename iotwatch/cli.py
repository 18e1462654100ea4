"""What every ``iotwatch`` command is built from: settings, shared options, output, signals.

The stages' commands (``gateway/cli.py``, ``alerts/cli.py``, ...) build on this module, and the
frame that registers them (:mod:`iotwatch.application.cli`) sits above every stage, so a stage's command
imports the core and its own stage only. The conventions every command keeps are in
docs/development.md ("Commands").
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints

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


#: The shared endpoint overrides: option name -> (metavar, help).
_ENDPOINTS = {
    "mqtt": ("mqtt://HOST:PORT", "MQTT broker (overrides IOTWATCH_MQTT_URL)."),
    "kafka": ("HOST:PORT", "Kafka bootstrap servers (overrides IOTWATCH_KAFKA_BOOTSTRAP_SERVERS)."),
    "influx": ("http://HOST:PORT", "InfluxDB URL, '' to disable (overrides IOTWATCH_INFLUX_URL)."),
}


def endpoint_options(*, mqtt: bool = False, kafka: bool = False, influx: bool = False) -> Callable[[F], F]:
    """Add the shared ``--mqtt/--kafka/--influx`` overrides for the services a command uses."""

    def apply(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            app = ctx.ensure_object(AppContext)
            try:
                app.override_endpoints(**{param.name or "": value})
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
        return value

    wanted = {"mqtt": mqtt, "kafka": kafka, "influx": influx}
    return compose(
        *(
            click.option(f"--{name}", metavar=metavar, expose_value=False, callback=apply, help=help_text)
            for name, (metavar, help_text) in _ENDPOINTS.items()
            if wanted[name]
        )
    )


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print a machine-readable JSON result as the last thing on stdout."
)


def compose(*decorators: Callable[[Any], Any]) -> Callable[[F], F]:
    """One decorator made of several (click options, arguments, pass decorators), applied so that
    ``--help`` lists their options in the order given."""

    def decorate(func: F) -> F:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return decorate


@dataclass(frozen=True)
class Preset:
    """A shared option's default and help in one command (what the option means stays the
    option set's; how much of it a command runs, and how it says so, is the command's)."""

    default: Any
    help: str | None = None


@dataclass(frozen=True)
class Opt:
    """A field of a settings model as a command-line option, declared beside the field
    (``homes: Annotated[int, Opt("Homes to simulate.")] = 10``), so its type, default and help
    are written once: :func:`field_options` makes the option ``--<field-name>`` (``flag``
    renames it), with the field's default, passing the value under the field's name."""

    help: str
    type: click.ParamType[Any] | None = None
    flag: str | None = None
    metavar: str | None = None
    is_flag: bool = False
    multiple: bool = False


def field_options(*models: type[Any]) -> Callable[[F], F]:
    """One option per field of ``models`` (pydantic models, dataclasses) annotated with an
    :class:`Opt`, in the order of the fields; a default that says something is shown."""
    options = []
    for model in models:
        if dataclasses.is_dataclass(model):
            defaults = {field.name: field.default for field in dataclasses.fields(model)}
        else:
            defaults = {name: field.get_default() for name, field in model.model_fields.items()}
        for name, hint in get_type_hints(model, include_extras=True).items():
            opt = next((meta for meta in getattr(hint, "__metadata__", ()) if isinstance(meta, Opt)), None)
            if opt is not None:
                default = defaults[name]
                options.append(
                    click.option(
                        opt.flag or "--" + name.replace("_", "-"),
                        name,
                        type=opt.type,
                        default=default,
                        show_default=default is not None and default is not False and default not in ("", ()),
                        metavar=opt.metavar,
                        is_flag=opt.is_flag,
                        multiple=opt.multiple,
                        help=opt.help,
                    )
                )
    return compose(*options)


def run_options(*, duration: Preset, homes: Preset, vehicles: Preset, rate: Preset | None = None) -> Callable[[F], F]:
    """The load of a run of the whole pipeline (``iotwatch demo``, ``iotwatch chaos``):
    ``--duration`` (wall-clock seconds), ``--rate`` (messages a second, for a command that
    paces the simulators), ``--homes`` and ``--vehicles`` (the simulated fleet)."""
    options = [click.option("--duration", type=float, default=duration.default, show_default=True, help=duration.help)]
    if rate is not None:
        options.append(click.option("--rate", type=float, default=rate.default, show_default=True, help=rate.help))
    options += [
        click.option("--homes", type=int, default=homes.default, show_default=True, help=homes.help),
        click.option("--vehicles", type=int, default=vehicles.default, show_default=True, help=vehicles.help),
    ]
    return compose(*options)


def seed_option(seed: Preset) -> Callable[[F], F]:
    """``--seed``: the same seed and options make the same run (devices, anomalies, faults,
    samples)."""
    return click.option("--seed", type=int, default=seed.default, show_default=True, help=seed.help)


def run_folder_option(command: str) -> Callable[[F], F]:
    """``--out``: the folder of one run of ``command`` (stack, checkpoint, archive, logs,
    report), handed to the command resolved; by default a new one under ``~/.iotwatch/<command>``
    named by the time."""

    def resolve(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path:
        return (value or Path.home() / ".iotwatch" / command / time.strftime("%Y%m%d-%H%M%S")).resolve()

    return click.option(
        "--out",
        type=click.Path(file_okay=False, path_type=Path),
        callback=resolve,
        help=f"Run folder (stack, checkpoint, archive, logs, report); default ~/.iotwatch/{command}/<time>.",
    )


class NumberList(click.ParamType[list[int]]):
    """Comma-separated numbers (``5000,20000``), as whole numbers: the sizes or rates of a
    series of runs."""

    name = "text"  # the metavar --help shows: TEXT

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[int]:
        if isinstance(value, list):
            return value
        try:
            return [int(float(part)) for part in str(value).split(",") if part.strip()]
        except ValueError:
            self.fail(f"{value!r}: give comma-separated numbers", param, ctx)


def latency_options(*, rate: Preset, seconds: Preset, rates: bool = False) -> Callable[[F], F]:
    """The latency runs of a benchmark: ``--rate`` (input records a second; with ``rates``
    a comma-separated series, one run each) and ``--latency-seconds`` (how long each runs)."""
    return compose(
        click.option(
            "--rate",
            "rates" if rates else "rate",
            type=NumberList() if rates else float,
            default=rate.default,
            show_default=True,
            help=rate.help,
        ),
        click.option("--latency-seconds", type=float, default=seconds.default, show_default=True, help=seconds.help),
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


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def interrupt_on_sigterm() -> None:
    """SIGTERM (``kill``, a supervisor, a CI timeout) unwinds the command as Ctrl-C does: a
    command that starts servers and children stops them on its way out instead of dying
    and leaving them running."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def stop_on_signals() -> threading.Event:
    """SIGTERM and Ctrl-C end a command's loop at the next safe point instead of killing it mid-post."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


class LazyGroup(click.Group):
    """A group whose sub-commands (``registry``: name -> "module:attribute") are imported when used."""

    #: Sub-command name -> "module:attribute", literal: the layering test reads these names as imports.
    registry: dict[str, str] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.registry})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.registry:
            module_name, attribute = self.registry[cmd_name].split(":")
            command: click.Command = getattr(importlib.import_module(module_name), attribute)
            return command
        return super().get_command(ctx, cmd_name)


class Working:
    """What a command is doing while it prints nothing else: on a terminal, a line on stderr
    (rich) with the current step and the seconds so far, gone when the work is done; in a
    pipe or a log, one log line per step. Commands that can be silent for more than two
    seconds (Spark starting, a long merge) show it from their first second.

    >>> with Working("testing") as working:
    ...     working.step("a step")
    """

    def __init__(self, what: str) -> None:
        self.what, self.current = what, ""
        self.started = time.monotonic()
        self._status: Any = None
        self.finished = False

    def __enter__(self) -> Working:
        if sys.stderr.isatty():
            from rich.console import Console

            self._status = Console(stderr=True).status(self._text(), spinner="dots")
            self._status.start()
            threading.Thread(target=self._tick, name="working", daemon=True).start()
        else:
            import logging

            logging.getLogger("iotwatch").info("%s ...", self.what)
        return self

    def step(self, text: str) -> None:
        """Name the step in progress (nothing once done)."""
        if self.finished:
            return
        self.current = text
        if self._status is None:
            import logging

            logging.getLogger("iotwatch").info("%s: %s", self.what, text)
        else:
            self._status.update(self._text())

    def done(self) -> None:
        """The work is done (or its own output starts): the line goes."""
        self.finished = True
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _text(self) -> str:
        step = f": {self.current}" if self.current else ""
        return f"{self.what}{step} ({time.monotonic() - self.started:.0f} s)"

    def _tick(self) -> None:
        while self._status is not None:
            status = self._status
            if status is not None:
                status.update(self._text())
            time.sleep(0.5)

    def __exit__(self, *_exc: object) -> None:
        self.done()
