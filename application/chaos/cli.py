"""``iotwatch chaos``: load with every component killed on a seeded schedule, nothing lost."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from iotwatch.application.chaos.schedule import FAULT_KINDS
from iotwatch.application.harness.options import scenario_options
from iotwatch.cli import AppContext, Preset, emit, interrupt_on_sigterm, pass_app


@click.command(context_settings={"show_default": True})
@scenario_options(
    "chaos",
    seed=Preset(1, "Same seed, same fault schedule and devices."),
    duration=Preset(600.0, "Seconds of load with faults (wall clock)."),
    rate=Preset(2000.0, "Messages a second from the simulators."),
    homes=Preset(40, "Simulated homes (the rate is spread over their devices)."),
    vehicles=Preset(2, "Simulated vehicles."),
)
@click.option(
    "--spacing",
    default=45.0,
    help="Seconds between planned faults; every kind runs at least once whatever the duration.",
)
@click.option(
    "--fault",
    "faults",
    multiple=True,
    type=click.Choice([kind.name for kind in FAULT_KINDS]),
    help="A fault kind to inject (repeatable); default every kind. One kind repeated chases one failure.",
)
@click.option(
    "--kafka-nodes",
    default=1,
    type=click.IntRange(min=1, max=9),
    help="Nodes of the Kafka cluster; with 3, each Kafka fault hits one node in turn and the "
    "topics keep 3 replicas (min.insync.replicas 2).",
)
@click.option("--lead", default=30.0, help="Seconds of load before the first fault.")
@click.option("--warm-up", default=120.0, help="Seconds after each process start not judged for growth.")
@click.option(
    "--min-span",
    default=120.0,
    help="Seconds of samples after warm-up a process needs before its growth is judged.",
)
@click.option(
    "--rss-limit",
    default=1.0,
    help="MB a minute of growth of anonymous resident memory (RSS without mapped files) after "
    "warm-up that fails the run.",
)
@pass_app
def chaos(
    app: AppContext,
    duration: float,
    rate: float,
    homes: int,
    vehicles: int,
    seed: int,
    spacing: float,
    faults: tuple[str, ...],
    kafka_nodes: int,
    lead: float,
    warm_up: float,
    min_span: float,
    rss_limit: float,
    out: Path,
    as_json: bool,
) -> None:
    """Run the pipeline under load and kill, interrupt and pause every component on a schedule.

    Starts the embedded stack, the streaming job, the gateway, the responder, the forwarder
    (to a local receiver) and the simulators; then, on a seeded schedule, kill -9s and starts
    again the gateway, the job (also Ctrl-C to its process group), the responder, the
    forwarder, mosquitto, Kafka (with --kafka-nodes 3, one node of three in turn) and
    InfluxDB, and pauses mosquitto and Kafka (SIGSTOP) for a while. Afterwards it proves
    from the data: loss 0 by seq from device to archive, the alert ids equal to a fault-free
    replay of the raw topic, every alert record notified (repeats deduplicated by
    Idempotency-Key), every command acknowledged or expired with its audit, every fault
    recovered (seconds per fault); and that no process's RSS, file descriptors or threads
    grow while the pipeline runs undisturbed after warm-up. Writes summary.json and plots to the run
    folder's report/; exits 1 when any proof fails.
    """
    from iotwatch.application.chaos.resources import Limits
    from iotwatch.application.chaos.runner import ChaosOptions, run_chaos
    from iotwatch.application.chaos.schedule import ScheduleOptions, fault_kind
    from iotwatch.application.chaos.summary import print_summary
    from iotwatch.application.harness import results
    from iotwatch.jvm.spark import require_java

    require_java()
    interrupt_on_sigterm()
    options = ChaosOptions(
        out=out,
        schedule=ScheduleOptions(
            duration_s=duration,
            seed=seed,
            spacing_s=spacing,
            lead_s=lead,
            kinds=tuple(fault_kind(name) for name in faults) or FAULT_KINDS,
        ),
        rate=rate,
        homes=homes,
        vehicles=vehicles,
        warm_up_s=warm_up,
        min_span_s=min_span,
        limits=Limits(anon_bytes=rss_limit * 1_000_000),
    )
    console = Console(stderr=True)
    settings = app.settings.model_copy(
        update={"stack": app.settings.stack.model_copy(update={"kafka_nodes": kafka_nodes})}
    )
    summary = run_chaos(settings, options, console)
    emit(results.as_json(summary), as_json, lambda _: print_summary(console, summary))
    if not summary.ok:
        raise SystemExit(1)
