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
from models.catalog import DEFAULT_DETECTOR, make, names
from models.evaluation.sources import read_nab_csv

__all__ = ["score_csv", "score_file"]

log = logging.getLogger(__name__)


def score_file(source: Path, target: Path, detector: str = DEFAULT_DETECTOR) -> dict[str, Any]:
    """Score ``source`` (``timestamp,value``) row by row into ``target`` (``+anomaly_score``)."""
    t_ms, values = read_nab_csv(source)
    raw = pd.read_csv(source, usecols=["timestamp", "value"], dtype=str, keep_default_na=False)
    check_rows(source, t_ms, values, raw)
    model = make(detector)
    warmup = model.warmup_readings()
    warning = None
    if len(t_ms) < warmup:
        warning = (f"{source.name} has {len(t_ms)} rows, fewer than the {warmup} readings {detector} learns from "
                   f"before it scores: every score is 0 (a detector with a shorter warm-up: --detector robust_zscore)")
        log.warning("%s", warning)
    scores = model.score_learn_many(values.reshape(-1, 1), t_ms, ["value"])
    scores = np.clip(np.nan_to_num(scores, nan=0.0), 0.0, 1.0)
    with target.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["timestamp", "value", "anomaly_score"])
        for stamp, value, score in zip(raw["timestamp"], raw["value"], scores.tolist(), strict=True):
            writer.writerow([stamp, value, f"{score:.6f}"])
    return {"input": str(source), "output": str(target), "detector": detector, "rows": len(t_ms),
            "max_score": round(float(scores.max()), 6) if len(scores) else None, "warmup_readings": warmup,
            "warning": warning}


def check_rows(source: Path, t_ms: np.ndarray, values: np.ndarray, raw: pd.DataFrame) -> None:
    """Timestamps in time order and values that are numbers, or an error naming the first
    row that is not (row 1 is the first after the header)."""
    backwards = np.flatnonzero(np.diff(t_ms) < 0)
    if len(backwards):
        row = int(backwards[0]) + 1  # 0-based index of the later row
        raise IotwatchError(f"{source}: row {row + 1}: timestamp {raw['timestamp'][row]} is earlier than row {row}'s "
                            f"{raw['timestamp'][row - 1]} (rows must be in time order)")
    missing = np.flatnonzero(~np.isfinite(values))
    if len(missing):
        row = int(missing[0])
        raise IotwatchError(f"{source}: row {row + 1}: value {raw['value'][row]!r} is not a finite number")


@click.command("score-csv")
@click.argument("source", metavar="IN.csv", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("target", metavar="OUT.csv", type=click.Path(dir_okay=False, writable=True, path_type=Path))
@click.option("--detector", default=DEFAULT_DETECTOR, show_default=True, type=click.Choice(names()),
              help="Detector from the catalog.")
@json_option
def score_csv(source: Path, target: Path, detector: str, as_json: bool) -> None:
    """Score a timestamp,value CSV (NAB format) row by row, in order, with no look-ahead.

    Writes timestamp,value,anomaly_score (six decimals); the output is deterministic.
    """
    result = score_file(source, target, detector)
    emit(result, as_json, lambda r: click.echo(f"scored {r['rows']} rows with {r['detector']} -> {r['output']}"))
