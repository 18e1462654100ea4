"""``iotwatch archive``: housekeeping of the Parquet archive the streaming job writes."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import click

from iotwatch.cli import AppContext, Working, emit, json_option, output_console, pass_app, stop_on_signals
from iotwatch.errors import IotwatchError
from iotwatch.streaming.cli import archive_option

log = logging.getLogger(__name__)


@click.group()
def archive() -> None:
    """The Parquet archive of clean readings (the batch layer's master dataset)."""


@archive.command()
@archive_option
@click.option(
    "--min-age",
    "min_age_s",
    type=click.FloatRange(min=60),
    default=3600.0,
    show_default=True,
    help="Seconds since a file was written before it is merged (at least 60: the job may still rewrite "
    "a file while it re-runs a failed micro-batch).",
)
@click.option(
    "--target-size",
    "target_mb",
    type=click.FloatRange(min=1),
    default=128.0,
    show_default=True,
    help="Megabytes an output file grows to at most; files already this large are left alone.",
)
@click.option(
    "--every",
    "every_s",
    type=click.FloatRange(min=60),
    default=None,
    help="Compact again every this many seconds until stopped (SIGTERM or Ctrl-C), for a container or "
    "service with no cron; a round that fails is logged and the next one runs.",
)
@json_option
@pass_app
def compact(
    app: AppContext, archive_dir: Path | None, min_age_s: float, target_mb: float, every_s: float | None, as_json: bool
) -> None:
    """Merge the archive's small files into few, rows unchanged.

    The running job writes a file per Kafka partition, date and device type each
    micro-batch, many thousands an hour; readers (``iotwatch train``, Spark SQL, pandas)
    pay for every file. Safe while the job runs: only files older than --min-age are
    merged, and each output is in place before its inputs are removed. Run it on a
    schedule (a cron job or a systemd timer, hourly), or with --every as a service of its
    own. A file that cannot be read leaves the files it would be merged with as they
    are, and the exit status is 1.
    """
    from iotwatch.streaming.archive_compaction import compact as run

    root = archive_dir or app.settings.stream.archive_dir

    def once() -> dict[str, Any]:
        with Working(f"compacting {root}"):
            done = run(root, min_age_s=min_age_s, target_bytes=int(target_mb * 2**20))
        result = {"archive": str(root), **done.to_dict()}
        if as_json and every_s is not None:  # a line a round (JSON Lines), for a log collector
            click.echo(json.dumps(result))
        else:
            emit(result, as_json, _render)
        return result

    if every_s is None:
        if once()["failed_groups"]:  # a schedule's failure mail says so; the files are left as they were
            raise SystemExit(1)
        return
    stop = stop_on_signals()
    while True:
        try:
            if failed := once()["failed_groups"]:
                log.error("%d group(s) left as they were; the next round tries again", len(failed))
        except (IotwatchError, OSError) as error:  # another compaction's lock, a full or missing disk
            log.error("compaction of %s failed: %s; the next round tries again", root, error)
        if stop.wait(every_s):
            return


def _render(result: dict[str, Any]) -> None:
    output_console().print(
        f"{result['archive']}: {result['files_before']:,} files -> {result['files_after']:,} "
        f"({result['files_merged']:,} merged into {result['files_written']:,}, "
        f"{result['superseded_removed']:,} superseded removed; {result['rows_merged']:,} rows) "
        f"in {result['seconds']:.1f} s"
    )
    for failure in result["failed_groups"]:
        output_console().print(f"[red]left as they were: {failure}[/red]")
