"""``iotwatch simulate``: publish a simulated fleet (or replayed streams) over MQTT."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import click

from iotwatch.cli import (
    AppContext,
    Preset,
    emit,
    endpoint_options,
    field_options,
    json_option,
    pass_app,
    seed_option,
)
from iotwatch.devices import seq_state
from iotwatch.devices.anomaly_kinds import ANOMALY, KINDS, TRANSPORT, check_kinds
from iotwatch.devices.config import HOME_TYPES, RunOptions, SimConfig

__all__ = ["simulate"]

_ANOMALY_KINDS = sorted(k for k, v in KINDS.items() if v.category != TRANSPORT)
_FAULT_KINDS = sorted(k for k, v in KINDS.items() if v.category == TRANSPORT)


def _kinds(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    if not value:
        return None
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _mix(_ctx: click.Context, _param: click.Parameter, value: str | None) -> dict[str, int] | None:
    if not value:
        return None
    mix: dict[str, int] = {}
    for part in value.split(","):
        name, _, number = part.partition("=")
        name = name.strip()
        if name not in HOME_TYPES:
            raise click.BadParameter(
                f"unknown home device type {name!r}; choose from {', '.join(HOME_TYPES)}", param_hint="--mix"
            )
        try:
            mix[name] = int(number or "1")
        except ValueError:
            raise click.BadParameter(f"{part!r}: expected TYPE=COUNT", param_hint="--mix") from None
        if not 0 <= mix[name] <= 3:
            raise click.BadParameter(f"{part!r}: 0 to 3 devices of a type per home", param_hint="--mix")
    return mix


def _time_ms(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    from iotwatch.devices.recorded import parse_time_ms

    try:
        return parse_time_ms(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO time or epoch seconds/ms", param_hint="--start-time"
        ) from None


@click.command()
@field_options(SimConfig, RunOptions)
@click.option(
    "--mix",
    metavar="TYPE=N,...",
    callback=_mix,
    help="Devices per home, e.g. 'thermostat=1,door_sensor=2' "
    "(types: " + ", ".join(HOME_TYPES) + "); default: each home draws its own mix.",
)
@click.option("--qos", type=click.Choice(["0", "1"]), help="MQTT QoS [default: IOTWATCH_MQTT_QOS, 1].")
@seed_option(Preset(1, "Same seed and options, same messages."))
@click.option(
    "--anomalies",
    "anomaly_kinds",
    metavar="KIND,...",
    callback=_kinds,
    help="Anomaly kinds --anomaly-rate draws from (default all that apply, but those drawn only when named: "
    + ", ".join(k for k in _ANOMALY_KINDS if not KINDS[k].drawn_by_default)
    + "): "
    + ", ".join(_ANOMALY_KINDS),
)
@click.option(
    "--faults",
    "fault_kinds",
    metavar="KIND,...",
    callback=_kinds,
    help="Transport faults --fault-rate draws from (default all): " + ", ".join(_FAULT_KINDS),
)
@click.option(
    "--start-time",
    metavar="ISO|EPOCH",
    callback=_time_ms,
    help="Event time of the start (default: now; accelerated runs end about now).",
)
@click.option("--username", help="MQTT user name (overrides IOTWATCH_MQTT_USERNAME).")
@click.option("--password", help="MQTT password (prefer IOTWATCH_MQTT_PASSWORD).")
@click.option(
    "--tls-ca-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="CA bundle for mqtts:// brokers.",
)
@click.option("--tls-insecure", is_flag=True, default=None, help="Skip TLS certificate verification (testing).")
@click.option("--progress/--no-progress", default=None, help="Live progress line on stderr [default: if a terminal].")
@click.option(
    "--seq-state",
    "seq_state_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="File each device's seq and event time carry on from, run after run, so a second run is "
    "scored like the first (default ~/.iotwatch/simulate/seq-<broker>.json).",
)
@click.option(
    "--fresh-seq",
    is_flag=True,
    help="Forget the --seq-state file first: every device starts at seq 0 (for a new pipeline).",
)
@endpoint_options(mqtt=True)
@json_option
@click.pass_context
@pass_app
def simulate(app: AppContext, ctx: click.Context, /, **opts: Any) -> None:
    """Simulate homes and vehicles publishing telemetry over MQTT.

    Every message follows the contract (docs/contract.md); each device also keeps a
    retained online/offline status. Anomalies and transport faults can be injected by rate
    or scenario, with the ground truth written as JSONL. Ends with a summary (--json for
    machine-readable output).
    """
    from iotwatch.devices.broker_run import default_start_ms, run

    mqtt = app.settings.mqtt
    update: dict[str, Any] = {key: opts[key] for key in ("username", "tls_ca_file", "tls_insecure") if opts[key]}
    if opts["password"]:
        from pydantic import SecretStr

        update["password"] = SecretStr(opts["password"])
    mqtt = mqtt.model_copy(update=update)
    replay = opts["replay"] = tuple(opts["replay"])
    fleet_given = any(
        ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE for name in ("homes", "vehicles")
    )
    if replay and not fleet_given:
        opts["homes"], opts["vehicles"] = 0, 0
    # each option is named after the SimConfig or RunOptions field it sets
    config = SimConfig(**{name: opts[name] for name in SimConfig.model_fields if name in opts})
    if config.homes + config.vehicles + len(replay) == 0:
        raise click.UsageError("nothing to simulate: give --homes, --vehicles or --replay")
    _check_kinds(config)
    state_path = opts["seq_state_path"] or seq_state.default_path(mqtt.url)
    if opts["fresh_seq"]:
        state_path.unlink(missing_ok=True)
    try:
        known = seq_state.load(state_path)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    config = config.model_copy(update={"seq_state": state_path})
    opts["qos"] = int(opts["qos"]) if opts["qos"] is not None else mqtt.qos
    opts["progress"] = sys.stderr.isatty() if opts["progress"] is None else opts["progress"]
    run_fields = [field.name for field in dataclasses.fields(RunOptions) if field.name != "mqtt"]
    options = RunOptions(mqtt=mqtt, **{name: opts[name] for name in run_fields})
    start = opts["start_time"]
    if start is None:
        if replay and opts["replay_keep_time"]:
            from iotwatch.devices.recorded import stream_start_ms

            start = stream_start_ms(replay)
        else:
            start = default_start_ms(config, options)
            if known:  # event time carries on too: the devices' clocks do not run backwards
                start = max(start, max(ts for _, ts in known.values()) + config.tick_ms)
    config = config.model_copy(update={"start_ms": start - start % config.tick_ms})
    # validate kinds and scenario before connecting
    from iotwatch.devices.injector import Injector
    from iotwatch.devices.rng import CounterRng

    Injector(config, [], CounterRng(config.seed))
    summary = run(config, options)
    emit(summary, opts["as_json"], _render)
    if summary["errors"]:
        raise SystemExit(1)


def _check_kinds(config: SimConfig) -> None:
    """--anomalies/--faults name kinds of their own category that this fleet can produce,
    and are not given without the rate that draws them."""
    from iotwatch.devices.fleet import fleet_rate

    device_types = set(fleet_rate(config)[1]) | ({config.replay_device_type} if config.replay else set())
    for names, category, rate, options in (
        (config.anomaly_kinds, ANOMALY, config.anomaly_rate, ("--anomalies", "--anomaly-rate")),
        (config.fault_kinds, TRANSPORT, config.fault_rate, ("--faults", "--fault-rate")),
    ):
        if not names:
            continue
        try:
            check_kinds(names, category, device_types)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        if rate <= 0:
            raise click.UsageError(f"{options[0]} has no effect without {options[1]} (a rate above 0)")
    _check_anomaly_window(config)


def _check_anomaly_window(config: SimConfig) -> None:
    """--anomalies-after must leave --anomaly-rate some event time to inject in."""
    after = config.anomalies_after_s
    if after > 0 and config.anomaly_rate <= 0:
        raise click.UsageError("--anomalies-after has no effect without --anomaly-rate (a rate above 0)")
    if config.anomaly_rate > 0 and config.duration_s is not None and after >= config.duration_s:
        raise click.UsageError(
            f"--anomalies-after {after:g} is not before the end of --duration {config.duration_s:g}: "
            "no anomaly would be injected"
        )


def readings_line(summary: dict[str, Any]) -> str:
    """How the messages sent (the table's total) follow from the readings generated.

    >>> print(readings_line({"readings": 600, "withheld": 4, "extra_copies": 2, "sent": 598,
    ...                      "status_messages": 3, "errors": 0}))  # doctest: +NORMALIZE_WHITESPACE
    readings 600 generated, 4 withheld by injected dropouts, 2 extra copies (duplicate faults):
    598 sent as telemetry messages; status messages 3; errors 0
    """
    expected = summary["readings"] - summary["withheld"] + summary["extra_copies"]
    pending = expected - summary["sent"]
    return (
        f"readings {summary['readings']:,} generated, {summary['withheld']:,} withheld by injected dropouts, "
        f"{summary['extra_copies']:,} extra copies (duplicate faults)"
        + (f", {pending:,} delayed by faults past the end or not sent when stopped" if pending else "")
        + f": {summary['sent']:,} sent as telemetry messages; status messages {summary['status_messages']:,}; "
        f"errors {summary['errors']:,}"
    )


def _render(summary: dict[str, Any]) -> None:
    from rich.table import Table

    from iotwatch.cli import output_console

    console = output_console()
    table = Table(title="iotwatch simulate", show_header=True)
    table.add_column("device type")
    table.add_column("devices", justify="right")
    table.add_column("messages", justify="right")
    for name, n in summary["by_device_type"].items():
        table.add_row(name, f"{summary['devices'].get(name, 0):,}", f"{n:,}")
    table.add_row("[b]total", f"{summary['device_total']:,}", f"[b]{summary['sent']:,}")
    console.print(table)
    target = (
        f"{summary['target_rate']:,.0f}/s"
        if summary["target_rate"]
        else "as fast as possible"
        if summary["speedup"] is None
        else "n/a"
    )
    console.print(
        f"achieved {summary['achieved_rate']:,.0f} msg/s (target {target}) over {summary['wall_s']:.1f} s; "
        f"{summary['virtual_s']:,.0f} s of event time; qos {summary['qos']}; "
        f"{summary['processes']} process(es), {summary['connections']} connection(s)"
    )
    console.print(readings_line(summary))
    if summary["publish_latency"]:
        lat = summary["publish_latency"]
        console.print(
            f"publish latency (PUBACK): p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms, "
            f"max {lat['max_ms']:.2f} ms"
        )
    if summary["anomalies"]:
        console.print("injected: " + ", ".join(f"{k} {n}" for k, n in summary["anomalies"].items()))
    if summary["events"]:
        console.print("events: " + ", ".join(f"{k} {n}" for k, n in summary["events"].items()))
    if summary.get("ground_truth"):
        console.print(
            f"ground truth: {summary['ground_truth']['records']} records in {summary['ground_truth']['path']}"
        )
    state = summary.get("seq_state")
    if state:
        if state["carried_on"]:
            console.print(
                f"seq: {state['carried_on']:,} of {summary['device_total']:,} devices carried on from the "
                f"last run ({state['path']}): this run is scored like the first"
            )
        else:
            console.print(f"seq: every device started at 0; the next run carries on from {state['path']}")
    if summary.get("interrupted"):
        console.print("[yellow]interrupted: stopped early")
