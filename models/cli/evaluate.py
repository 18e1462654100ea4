"""``iotwatch evaluate``: run detectors over labelled streams and score them as NAB does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from iotwatch.cli import emit, json_option
from iotwatch.errors import IotwatchError
from models.catalog import DEFAULT_DETECTOR, names
from models.evaluation.nab_scoring import PROFILES
from models.evaluation.runner import evaluate as run_evaluation
from models.evaluation.sources import LabelledSource, NabSource, SimulatorSource

__all__ = ["evaluate", "default_dataset"]

#: Detectors evaluated when none is named: the statistical ones (rules need limits).
DEFAULT_EVALUATED = tuple(dict.fromkeys(
    (DEFAULT_DETECTOR, "half_space_trees", "ensemble", "isolation_forest", "robust_zscore",
     "holt_winters")))


def default_dataset() -> Path | None:
    """``../shared/datasets/nab-dev`` beside the repository, when present."""
    path = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "nab-dev"
    return path if path.is_dir() else None


def _render(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for name, det in result["detectors"].items():
        table = Table(title=f"{name}  (threshold {det['threshold']:.6g}, profile {result['profile']})")
        for column in ("stream / group", "NAB", "windows", "recall", "precision", "F1",
                       "delay rows", "delay h", "FA/day"):
            first = column == "stream / group"
            table.add_column(column, justify="left" if first else "right", overflow="fold" if first else "ellipsis",
                             min_width=20 if first else None)
        rows = [*det["streams"].items(), *((f"[b]{g}[/b]", s) for g, s in det["groups"].items()),
                ("[b]overall[/b]", det["overall"])]
        for label, s in rows:
            delay_h = None if s["median_delay_s"] is None else s["median_delay_s"] / 3600
            table.add_row(label, _f(s["nab_score"], 1), f"{s['detected_windows']}/{s['windows']}", _f(s["recall"]),
                          _f(s["precision"]), _f(s["f1"]), _f(s["median_delay_rows"], 0), _f(delay_h, 1),
                          _f(s["false_alarms_per_device_day"], 3))
        console.print(table)
    summary = ", ".join(f"{n} {d['overall']['nab_score']}" for n, d in result["detectors"].items())
    console.print(f"NAB {result['profile']} score on {result['streams']} streams / {result['windows']} windows: "
                  f"{summary}")


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


@click.command("evaluate")
@click.option("--dataset", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="NAB-layout directory (data/<group>/<file>.csv, windows.json); default ../shared/datasets/nab-dev.")
@click.option("--readings", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Simulator readings JSONL (use with --truth instead of --dataset).")
@click.option("--truth", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Simulator ground-truth JSONL (device_id, kind, start_ts, end_ts).")
@click.option("--detector", "detectors", multiple=True, type=click.Choice(names()),
              help=f"Detector to evaluate (repeatable; default: {', '.join(DEFAULT_EVALUATED)}).")
@click.option("--profile", default="standard", show_default=True, type=click.Choice(sorted(PROFILES)),
              help="NAB cost profile.")
@json_option
def evaluate(dataset: Path | None, readings: Path | None, truth: Path | None, detectors: tuple[str, ...],
             profile: str, as_json: bool) -> None:
    """Run detectors over labelled streams; report NAB score, precision/recall/F1,
    detection delay and false alarms per device-day, per stream, group and overall."""
    source: LabelledSource
    if readings or truth:
        if not (readings and truth) or dataset:
            raise IotwatchError("give --readings and --truth together, and not with --dataset")
        source = SimulatorSource(readings, truth)
    else:
        dataset = dataset or default_dataset()
        if dataset is None:
            raise IotwatchError("no --dataset given and ../shared/datasets/nab-dev is not there")
        source = NabSource(dataset)
    result = run_evaluation(source.streams(), list(detectors or DEFAULT_EVALUATED), PROFILES[profile])
    result = {"dataset": str(dataset or readings), "profile": profile, **result}
    emit(result, as_json, _render)
