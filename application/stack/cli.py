"""``iotwatch stack up|down|status|stop|start|restart``: the embedded servers for demos and tests."""

from __future__ import annotations

import shlex
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from iotwatch.application.stack import EmbeddedStack
from iotwatch.application.stack.embedded import forget_last_stack, remember_last_stack, resolve_run_dir
from iotwatch.cli import AppContext, emit, json_option, pass_app

run_dir_option = click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where servers keep config, data, logs and stack.json (default IOTWATCH_STACK_RUN_DIR or ~/.iotwatch/stack; "
    "status and down: the last stack started).",
)


@click.group()
def stack() -> None:
    """Start, stop and inspect the embedded MQTT, Apache Kafka and InfluxDB servers."""


@stack.command()
@run_dir_option
@click.option(
    "--partitions", type=click.IntRange(min=1), help="Partitions per topic (default IOTWATCH_KAFKA_PARTITIONS, 4)."
)
@click.option(
    "--mqtt-broker",
    type=click.Choice(["auto", "mosquitto", "amqtt"]),
    help="MQTT server: mosquitto when on PATH (auto), or the pip-installed amqtt.",
)
@click.option("--no-influx", is_flag=True, help="Run without InfluxDB.")
@click.option(
    "--sites",
    type=click.IntRange(min=0, max=20),
    help="Edge sites, each with its own MQTT broker and Kafka node, replicated to the central "
    "Kafka cluster by MirrorMaker 2 (default IOTWATCH_STACK_SITES, 0: one cluster).",
)
@click.option(
    "--kafka-nodes",
    type=click.IntRange(min=1, max=9),
    help="Nodes of the central Kafka cluster (default IOTWATCH_STACK_KAFKA_NODES, 1); with 3, "
    "topics keep 3 replicas and one node may fail.",
)
@click.option(
    "--tls",
    is_flag=True,
    default=None,
    help="Kafka's listeners speak TLS (SSL) with a certificate from a private CA in <run-dir>/tls; "
    "clients verify it with the ca_file printed (default IOTWATCH_STACK_TLS).",
)
@click.option("--foreground", is_flag=True, help="Stay attached; Ctrl-C (or SIGTERM) stops the stack.")
@json_option
@pass_app
def up(
    app: AppContext,
    run_dir: Path | None,
    partitions: int | None,
    mqtt_broker: str | None,
    no_influx: bool,
    sites: int | None,
    kafka_nodes: int | None,
    tls: bool | None,
    foreground: bool,
    as_json: bool,
) -> None:
    """Start the servers on free loopback ports, create topics and the database.

    With --kafka-nodes 3: a three-node central Kafka cluster (combined brokers and
    controllers), its topics replicated three times with min.insync.replicas 2.

    With --tls: every Kafka node's listener speaks TLS, its certificate signed by a private CA
    made in <run-dir>/tls; a plaintext client is refused. The output names the CA file
    (ca_file) and the IOTWATCH_KAFKA_* variables that make a client verify it.

    With --sites N: N edge sites (an MQTT broker and a one-node Kafka cluster each) and one
    MirrorMaker 2 per site copying its raw and dead-letter topics to the central cluster
    (as <site>.<topic>) and the central commands topic back to it.

    Each server is health-checked with a real client before this returns. The servers keep
    running after the command exits (unless --foreground); `iotwatch stack down` stops them.
    On a stack some of whose servers died, only those start again, on their own ports.
    """
    settings = app.settings
    given = {"mqtt_broker": mqtt_broker, "influxdb": "none" if no_influx else None, "sites": sites}
    given |= {"kafka_nodes": kafka_nodes, "tls": tls or None}
    stack_update = {key: value for key, value in given.items() if value is not None}
    kafka = settings.kafka.model_copy(update={"partitions": partitions}) if partitions else settings.kafka
    settings = settings.model_copy(update={"stack": settings.stack.model_copy(update=stack_update), "kafka": kafka})
    embedded = EmbeddedStack(settings, run_dir)
    state = embedded.up()
    if not foreground:
        remember_last_stack(state.run_dir)
    emit({**state.to_dict(), "stop": f"iotwatch stack down --run-dir {state.run_dir}"}, as_json, _render_up)
    if foreground:
        _hold_until_stopped()
        embedded.down()


def _render_up(result: dict[str, Any]) -> None:
    click.echo(f"stack up in {result['run_dir']}")
    for role, svc in result["services"].items():
        click.echo(f"  {role:<13}{svc['endpoint']:<32}{svc['implementation']}")
    if "influx" not in result["services"]:
        click.echo("  influx  (not running: metrics are disabled)")
    click.echo(f"  topics  {', '.join(result['topics'])} ({result['partitions']} partitions)")
    if result["ca_file"]:
        click.echo(f"  Kafka over TLS, verified with {result['ca_file']}")
    click.echo("point other shells at it with:")
    for name, value in result["env"].items():
        click.echo(f"  export {name}={shlex.quote(value)}")
    for site, ends in result["sites"].items():
        click.echo(f"site {site}: MQTT {ends['mqtt']}, Kafka {ends['kafka']}; its gateway and devices with:")
        for name in ("IOTWATCH_MQTT_URL", "IOTWATCH_KAFKA_BOOTSTRAP_SERVERS"):
            click.echo(f"  export {name}={ends['env'][name]}")
    click.echo(f"stop it with: {result['stop']}")


def _hold_until_stopped() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass


@stack.command()
@run_dir_option
@click.option("--purge", is_flag=True, help="Also delete the run directory (data and logs).")
@json_option
@pass_app
def down(app: AppContext, run_dir: Path | None, purge: bool, as_json: bool) -> None:
    """Stop every server `stack up` started from the run directory."""
    embedded = EmbeddedStack(app.settings, resolve_run_dir(app.settings, run_dir))
    stopped = embedded.down()
    forget_last_stack(embedded.run_dir)
    if purge:
        embedded.remove_data()
    emit(
        {"run_dir": str(embedded.run_dir), "stopped": stopped, "purged": purge},
        as_json,
        lambda r: click.echo(f"stopped: {', '.join(r['stopped']) or 'nothing was running'}"),
    )


def _restart(embedded: EmbeddedStack, role: str) -> str:
    embedded.stop_service(role)
    embedded.start_service(role)
    return "restarted"


#: ``stack NAME SERVICE``: what it does to one server of the stack (the others left running), and its help.
ONE_SERVER: dict[str, tuple[Callable[[EmbeddedStack, str], str], str]] = {
    "stop": (
        lambda embedded, role: "stopped" if embedded.stop_service(role) else "was not running",
        "Stop one server (kafka, mqtt, influx, a node such as kafka-2, a site's site1-kafka), leaving the "
        "others running: an outage to rehearse. `stack start SERVICE` brings it back on the same port with "
        "the same data, so every shell's exports stay valid.",
    ),
    "start": (
        lambda embedded, role: "started" if embedded.start_service(role) else "was running already",
        "Start one stopped server again on its own port with its own data; returns once a real client is served.",
    ),
    "restart": (_restart, "Stop one server and start it again on its own port with its own data."),
}


def _one_server_command(name: str, action: Callable[[EmbeddedStack, str], str], help_text: str) -> None:
    @stack.command(name, help=help_text)
    @click.argument("service", metavar="SERVICE")
    @run_dir_option
    @json_option
    @pass_app
    def command(app: AppContext, service: str, run_dir: Path | None, as_json: bool) -> None:
        embedded = EmbeddedStack(app.settings, resolve_run_dir(app.settings, run_dir))
        _emit_one(embedded, service, action(embedded, service), as_json)


for _name, (_action, _help) in ONE_SERVER.items():
    _one_server_command(_name, _action, _help)


def _emit_one(embedded: EmbeddedStack, role: str, outcome: str, as_json: bool) -> None:
    _state, service = embedded.service(role)
    result = {
        "run_dir": str(embedded.run_dir),
        "service": role,
        "outcome": outcome,
        "endpoint": service.endpoint,
        "pid": service.process.pid,
        "running": service.process.is_running(),
    }
    emit(result, as_json, lambda r: click.echo(f"{r['service']} {r['outcome']} ({r['endpoint']}, pid {r['pid']})"))


@stack.command()
@run_dir_option
@json_option
@pass_app
def status(app: AppContext, run_dir: Path | None, as_json: bool) -> None:
    """Report each server: process alive, and a real client's answer. Exit 1 if unhealthy."""
    result = EmbeddedStack(app.settings, resolve_run_dir(app.settings, run_dir)).status()
    emit(result, as_json, _render_status)
    if not result["up"]:
        raise SystemExit(1)


def _render_status(result: dict[str, Any]) -> None:
    if not result["services"]:
        click.echo(f"no stack in {result['run_dir']}")
        return
    for role, svc in result["services"].items():
        mark = "ok  " if svc["healthy"] else "FAIL"
        click.echo(f"{mark} {role:<13}{svc['endpoint']:<32}{svc['implementation']:<34}{svc['detail']}")


@stack.command()
@run_dir_option
@click.option("--site", "sites", multiple=True, help="A site's alias (repeatable; default: the stack's sites).")
@click.option(
    "--watch",
    type=click.FloatRange(min=0.1),
    metavar="SECONDS",
    help="Sample every SECONDS and write each sample to InfluxDB (measurement replication) until Ctrl-C.",
)
@json_option
@pass_app
def lag(app: AppContext, run_dir: Path | None, sites: tuple[str, ...], watch: float | None, as_json: bool) -> None:
    """How far the central Kafka cluster is behind each site, from MirrorMaker 2's heartbeats.

    The central cluster is the stack's (or IOTWATCH_KAFKA_BOOTSTRAP_SERVERS with --site when
    no stack runs from the run directory).
    """
    import time

    from iotwatch.application.stack.embedded import StackState
    from iotwatch.application.stack.replication import ReplicationLag, write_lag
    from iotwatch.clients.influx import InfluxV1Client

    settings = app.settings
    state = StackState.load(resolve_run_dir(settings, run_dir))
    if state is not None:
        settings = state.apply_to(settings)
    names = list(sites) or (state.sites if state else [])
    if not names:
        raise click.UsageError("no sites: name them with --site (or start a stack with --sites N)")
    monitor = ReplicationLag(settings.kafka, names)
    influx = InfluxV1Client(settings.influx) if watch and settings.influx.enabled else None
    try:
        while True:
            lags = monitor.sample()
            now_ms = int(time.time() * 1000)
            if influx is not None:
                write_lag(influx, lags, now_ms)
            emit({"lag_ms": lags}, as_json, lambda r: click.echo(_lag_line(r["lag_ms"])))
            if not watch:
                return
            time.sleep(watch)
    except KeyboardInterrupt:
        pass
    finally:
        monitor.close()
        if influx is not None:
            influx.close()


def _lag_line(lags: dict[str, int | None]) -> str:
    return "replication lag: " + ", ".join(
        f"{site} {'no heartbeat yet' if ms is None else f'{ms} ms'}" for site, ms in lags.items()
    )
