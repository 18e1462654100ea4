"""``iotwatch stream``: run the streaming job until Ctrl-C, SIGTERM or --duration."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from iotwatch.cli import AppContext, Working, emit, endpoint_options, json_option, pass_app
from iotwatch.settings import StreamSettings

if TYPE_CHECKING:
    from iotwatch.streaming.checkpoint import ResetTo

log = logging.getLogger(__name__)

#: ``--archive DIR``: the job writes the archive there, ``iotwatch archive`` looks after it.
archive_option = click.option(
    "--archive",
    "archive_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Parquet archive of clean readings (default IOTWATCH_STREAM_ARCHIVE_DIR).",
)


@click.command()
@endpoint_options(kafka=True, influx=True)
@click.option(
    "--checkpoint",
    "checkpoint_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Offsets and per-device state (default IOTWATCH_STREAM_CHECKPOINT_DIR, else "
    "~/.iotwatch/checkpoints/<Kafka cluster id>/stream); restart with the same directory to resume "
    "exactly where the job stopped.",
)
@archive_option
@click.option(
    "--trigger",
    "trigger_s",
    type=click.FloatRange(min=0),
    help="Seconds between micro-batch starts (default 0: each starts as soon as the previous one ends).",
)
@click.option(
    "--max-offsets-per-trigger",
    type=click.IntRange(min=1),
    help="Records per micro-batch at most (default IOTWATCH_STREAM_MAX_OFFSETS_PER_TRIGGER, "
    f"{StreamSettings.model_fields['max_offsets_per_trigger'].default:,}): larger batches catch up "
    "on a backlog faster, most of all with a large fleet.",
)
@click.option("--starting-offsets", help="earliest | latest | JSON per partition, for a new checkpoint.")
@click.option(
    "--reset-offsets",
    type=click.Choice(["earliest", "latest"]),
    help="Set the checkpoint aside (renamed, with its device state) and read the topic from its start or "
    "its end: the way out when Kafka no longer has the checkpoint's offsets.",
)
@click.option(
    "--available-now",
    is_flag=True,
    help="Process what is in Kafka now, then stop (same state and checkpoint as a continuous run).",
)
@click.option(
    "--duration", type=click.FloatRange(min=0, min_open=True), help="Stop after this many seconds (more than 0)."
)
@click.option(
    "--warm-up/--no-warm-up",
    default=True,
    show_default=True,
    help="In local mode, when no records are waiting, run a synthetic reading of each device type "
    "through the job's operator in a throwaway query before reading Kafka, so that the first readings "
    "do not wait for the JVM and the Python workers to warm up (not with --available-now).",
)
@json_option
@pass_app
def stream(
    app: AppContext,
    checkpoint_dir: Path | None,
    archive_dir: Path | None,
    trigger_s: float | None,
    max_offsets_per_trigger: int | None,
    starting_offsets: str | None,
    reset_offsets: ResetTo | None,
    available_now: bool,
    duration: float | None,
    warm_up: bool,
    as_json: bool,
) -> None:
    """Run the PySpark Structured Streaming job: clean, deduplicate, score, alert.

    Reads the raw telemetry topic, validates every record against the message contract
    (violations and late records go to the dead-letter topic with a reason), removes
    duplicates by (device_id, seq), scores every reading with per-device online detectors
    and rules, publishes raised/cleared alerts to the alert topic, archives clean readings
    to Parquet and writes aggregates and pipeline health to InfluxDB. Creates missing
    topics and the InfluxDB database. Refuses a checkpoint whose offsets Kafka no longer
    has (another stack's, a re-created topic's) before the query starts.
    """
    update: dict[str, Any] = {
        k: v
        for k, v in {
            "trigger_interval_s": trigger_s,
            "max_offsets_per_trigger": max_offsets_per_trigger,
            "starting_offsets": starting_offsets,
        }.items()
        if v is not None
    }
    from iotwatch.streaming.job import run_job  # (pyspark loads only when the job runs, not for --help)

    settings = app.settings
    settings = settings.model_copy(update={"stream": settings.stream.model_copy(update=update)})
    with Working("stream") as working:
        job = run_job(
            settings,
            checkpoint_dir,
            archive_dir,
            available_now=available_now,
            duration=duration,
            warm_up=warm_up,
            reset_offsets=reset_offsets,
            step=lambda text: working.step(text) if text else working.done(),
        )
    summary = {"batches": job.totals.get("batches", 0), "totals": dict(job.totals), "last_progress": job.reporter.last}
    emit(summary, as_json, render_summary)


def render_summary(summary: dict[str, Any]) -> None:
    """The stop summary as a table: the job's totals, then the last batch's progress."""
    from rich.table import Table

    from iotwatch.cli import output_console

    console = output_console()
    console.print(f"iotwatch stream: stopped after {summary['batches']:,} micro-batches")
    if not summary["totals"] and not summary["last_progress"]:
        return
    from iotwatch.streaming.progress import BATCH_GAUGES, PARTITION_GAUGES
    from iotwatch.streaming.schemas import TALLY_FIELDS

    table = Table()
    table.add_column("total")
    table.add_column("", justify="right")
    totals = summary["totals"]
    # each count once, under the name the gateway and the tallies use (received, scored,
    # duplicates, late, dead_lettered, ...); per-batch sizes are shown for the last batch below
    for name, label in TALLY_FIELDS.items():
        if name not in BATCH_GAUGES and name not in PARTITION_GAUGES:
            table.add_row(name.replace("_", " "), f"{totals.get(label, 0):,}")
    last = summary["last_progress"]
    if last:
        table.add_section()
        table.add_row("last batch: records", f"{last['input_rows']:,}")
        table.add_row("last batch: records/s", f"{last['processed_rows_per_s']:,.0f}")
        table.add_row("last batch: ms", f"{last['trigger_ms']:,}")
        if "state_devices_written" in last:
            table.add_row("last batch: devices in state shards written", f"{last['state_devices_written']:,}")
        table.add_row("last batch: Kafka lag", "?" if last["lag_records"] is None else f"{last['lag_records']:,}")
    console.print(table)
