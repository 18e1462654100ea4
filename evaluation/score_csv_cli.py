"""``iotwatch score-csv IN.csv OUT.csv``: stream a NAB-format CSV through a detector."""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

import click
import numpy as np
import pandas as pd

from iotwatch.cli import emit, json_option
from iotwatch.errors import IotwatchError
from iotwatch.evaluation.labelled_streams import declare_nab
from iotwatch.evaluation.sources import read_nab_csv
from iotwatch.models.catalog import DEFAULT_DETECTOR, make, names

__all__ = ["score_csv", "score_file"]

log = logging.getLogger(__name__)


#: Out-of-order rows listed by line number in the result (all are counted).
LISTED_OUT_OF_ORDER = 20


def out_of_order_lines(t_ms: np.ndarray) -> np.ndarray:
    """File line numbers (the header is line 1) of rows stamped earlier than the row before.

    >>> out_of_order_lines(np.array([1, 2, 5, 4, 6, 6]))
    array([5])
    """
    return np.flatnonzero(np.diff(t_ms) < 0) + 2 + 1


def score_file(
    source: Path, target: Path, detector: str = DEFAULT_DETECTOR, nab_protocol: bool = False
) -> dict[str, Any]:
    """Score ``source`` (``timestamp,value``) row by row into ``target`` (``+anomaly_score``).

    Live (the default), the detector is told nothing in advance; with ``nab_protocol`` it is
    told what NAB's base detector gives it (:func:`~iotwatch.evaluation.labelled_streams.declare_nab`).

    Rows are scored in the order of the file, as a streaming detector meets them: a row
    stamped earlier than the one before is scored where it stands, counted and listed by
    line number (``out_of_order``), not refused.
    """
    t_ms, values = read_nab_csv(source)
    raw = pd.read_csv(source, usecols=["timestamp", "value"], dtype=str, keep_default_na=False)
    check_values(source, values, raw)
    late = out_of_order_lines(t_ms)
    model = make(detector)
    if nab_protocol:
        declare_nab(model, values)
    warmup = model.warmup_readings()
    warning = None
    if len(t_ms) < warmup:
        warning = (
            f"{source.name} has {len(t_ms)} rows, fewer than the {warmup} readings {detector} learns from "
            f"before it scores: every score is 0 (a detector with a shorter warm-up: --detector robust_zscore)"
        )
        log.warning("%s", warning)
    scores = model.score_learn_many(values.reshape(-1, 1), t_ms, ["value"])
    scores = np.clip(np.nan_to_num(scores, nan=0.0), 0.0, 1.0)
    with target.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["timestamp", "value", "anomaly_score"])
        for stamp, value, score in zip(raw["timestamp"], raw["value"], scores.tolist(), strict=True):
            writer.writerow([stamp, value, f"{score:.6f}"])
    return {
        "input": str(source),
        "output": str(target),
        "detector": detector,
        "protocol": "nab" if nab_protocol else "live",
        "rows": len(t_ms),
        "max_score": round(float(scores.max()), 6) if len(scores) else None,
        "warmup_readings": warmup,
        "warning": warning,
        "out_of_order": int(len(late)),
        "out_of_order_lines": late[:LISTED_OUT_OF_ORDER].tolist(),
    }


def check_values(source: Path, values: np.ndarray, raw: pd.DataFrame) -> None:
    """Values that are numbers, or an error naming the first row that is not (row 1 is the
    first after the header). Timestamps out of order are not refused: see :func:`score_file`."""
    missing = np.flatnonzero(~np.isfinite(values))
    if len(missing):
        row = int(missing[0])
        raise IotwatchError(f"{source}: row {row + 1}: value {raw['value'][row]!r} is not a finite number")


@click.command("score-csv")
@click.argument("source", metavar="IN.csv", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("target", metavar="OUT.csv", type=click.Path(dir_okay=False, writable=True, path_type=Path))
@click.option(
    "--detector",
    default=DEFAULT_DETECTOR,
    show_default=True,
    type=click.Choice(names()),
    help="Detector from the catalog.",
)
@click.option(
    "--nab-protocol",
    is_flag=True,
    help="Tell the detector, before the first row, what NAB's base detector gives it: the file's "
    "minimum and maximum and a probation of 15 %% of its rows (without it: nothing in advance, as live).",
)
@json_option
def score_csv(source: Path, target: Path, detector: str, nab_protocol: bool, as_json: bool) -> None:
    """Score a timestamp,value CSV (NAB format) row by row, in order, with no look-ahead.

    Writes timestamp,value,anomaly_score (six decimals); the output is deterministic. A row
    stamped earlier than the one before is scored in file order, with a warning naming its line.
    """
    result = score_file(source, target, detector, nab_protocol)
    if result["out_of_order"]:
        more = result["out_of_order"] - len(result["out_of_order_lines"])
        click.echo(
            f"warning: {source}: {result['out_of_order']} row(s) stamped earlier than the row before, "
            f"scored in file order: line(s) {', '.join(map(str, result['out_of_order_lines']))}"
            + (f" and {more} more" if more > 0 else ""),
            err=True,
        )
    emit(
        result,
        as_json,
        lambda r: click.echo(
            f"scored {r['rows']} rows with {r['detector']} ({r['protocol']} protocol) -> {r['output']}"
        ),
    )
