"""``iotwatch demo``: the README's main command."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from iotwatch.application.harness.options import scenario_options
from iotwatch.cli import AppContext, Preset, emit, interrupt_on_sigterm, pass_app


@click.command(context_settings={"show_default": True})
@scenario_options(
    "demo",
    seed=Preset(1),
    duration=Preset(90.0, "Seconds the simulators run (wall clock)."),
    homes=Preset(6, "Simulated homes (several devices each)."),
    vehicles=Preset(2, "Simulated vehicles with event data recorders."),
)
@click.option(
    "--speedup",
    default=10.0,
    help="Event time runs this many times faster than the wall clock (detectors need history).",
)
@click.option("--anomaly-rate", default=6.0, help="Anomalies per device per hour of event time.")
@click.option(
    "--fault-rate",
    default=3.0,
    help="Transport faults (duplicates, late, out of order, malformed) per device-hour of event time.",
)
@click.option(
    "--anomalies-after",
    "anomalies_after",
    type=click.FloatRange(min=0),
    default=60.0,
    metavar="SECONDS",
    help="Seconds of event time before the first injected anomaly: the detectors warm "
    "up on about 60 readings (one a second for home devices), so earlier anomalies would be unfair misses.",
)
@click.option(
    "--keep-stack",
    is_flag=True,
    help="Leave MQTT, Kafka and InfluxDB running afterwards (to query them or point Grafana at them); "
    "prints their URLs and the `iotwatch stack down` command that stops them.",
)
@click.option(
    "--sites",
    type=click.IntRange(min=0, max=20),
    default=0,
    help="Edge sites: each its own MQTT broker, Kafka node, gateway and simulators (--homes and "
    "--vehicles each), replicated to the central Kafka cluster by MirrorMaker 2; the summary "
    "reports per site (0: one cluster).",
)
@click.option(
    "--tls",
    is_flag=True,
    help="Kafka over TLS: every Kafka node's listener (and each site's MirrorMaker link) speaks "
    "SSL, verified with a private CA the stack makes (as stack up --tls).",
)
@pass_app
def demo(
    app: AppContext,
    duration: float,
    homes: int,
    vehicles: int,
    speedup: float,
    anomaly_rate: float,
    fault_rate: float,
    anomalies_after: float,
    seed: int,
    out: Path,
    keep_stack: bool,
    sites: int,
    tls: bool,
    as_json: bool,
) -> None:
    """Run the whole pipeline on the embedded stack and report what happened.

    Starts MQTT, Kafka and InfluxDB servers, the streaming job, the gateway and the device
    simulators (with injected anomalies, transport faults and ground truth); shows rates per
    stage, Kafka lag and the alert stream until --duration or Ctrl-C; drains every stage;
    then prints messages per stage, loss accounted by seq (0 expected), duplicates, alerts
    against the ground truth (recall, precision, delay), latency and whether every dashboard
    query returns data, and writes a report folder with PNG plots and summary.json. Stops
    everything it started (but the stack with --keep-stack).
    """
    from iotwatch.application.demo.runner import DemoOptions, check_prerequisites, run_demo
    from iotwatch.application.demo.summary import print_kept_stack, print_summary
    from iotwatch.application.harness import results

    check_prerequisites()
    interrupt_on_sigterm()
    console = Console(stderr=as_json)
    options = DemoOptions(
        duration,
        homes,
        vehicles,
        speedup,
        anomaly_rate,
        fault_rate,
        seed,
        out,
        anomalies_after,
        keep_stack,
        sites,
        tls,
    )
    summary = run_demo(app.settings, options, console)
    if as_json and summary.stack:
        print_kept_stack(console, summary.stack)
    emit(results.as_json(summary), as_json, lambda _: print_summary(console, summary))
    if summary.lost:
        raise SystemExit(1)
