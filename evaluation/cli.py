"""``iotwatch evaluate``: run detectors over labelled streams and score them as NAB does, or
(``--simulated``) measure the streaming job's alerts on a simulated fleet."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from iotwatch.cli import Preset, emit, json_option, seed_option
from iotwatch.errors import IotwatchError
from iotwatch.evaluation.labelled_streams import PROTOCOLS
from iotwatch.evaluation.labelled_streams import evaluate as run_evaluation
from iotwatch.evaluation.nab_scoring import PROFILES
from iotwatch.evaluation.sources import NAB_SAMPLE, LabelledSource, NabSource, SimulatorSource, split_keys
from iotwatch.models.catalog import DEFAULT_DETECTOR, names

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["evaluate"]

#: Detectors evaluated when none is named: the statistical ones (rules need limits).
DEFAULT_EVALUATED = tuple(
    dict.fromkeys(
        (
            DEFAULT_DETECTOR,
            "hst_ranked",
            "tail_ensemble",
            "isolation_forest",
            "robust_zscore",
        )
    )
)


def _render(result: dict[str, Any]) -> None:
    from iotwatch.cli import output_console

    console = output_console()
    for name, det in result["detectors"].items():
        table = _table(
            f"{name}  (threshold {det['threshold']:.6g}, profile {result['profile']}, {result['protocol']} protocol)",
            ("stream / group", "NAB", "windows", "recall", "precision", "F1", "delay rows", "delay h", "FA/day"),
            wrap_first=True,
        )
        rows = [
            *det["streams"].items(),
            *((f"[b]{g}[/b]", s) for g, s in det["groups"].items()),
            ("[b]overall[/b]", det["overall"]),
        ]
        for label, s in rows:
            delay_h = None if s["median_delay_s"] is None else s["median_delay_s"] / 3600
            table.add_row(
                label,
                _f(s["nab_score"], 1),
                f"{s['detected_windows']}/{s['windows']}",
                _f(s["recall"]),
                _f(s["precision"]),
                _f(s["f1"]),
                _f(s["median_delay_rows"], 0),
                _f(delay_h, 1),
                _f(s["false_alarms_per_device_day"], 3),
            )
        console.print(table)
    summary = ", ".join(f"{n} {d['overall']['nab_score']}" for n, d in result["detectors"].items())
    console.print(
        f"NAB {result['profile']} score on {result['streams']} streams / {result['windows']} windows: {summary}"
    )
    if result.get("published_comparison"):
        _render_comparison(console, result["published_comparison"])


def _render_comparison(console: Any, comparison: dict[str, Any]) -> None:
    """The default, the reproduced CAD OSE and NAB's published figures, per half and whole."""
    from iotwatch.evaluation.published import DEFAULT_FIGURES

    parts = comparison["parts"]
    table = _table(
        "nab-dev streams: the default under both protocols beside a reproduced NAB leader and the "
        "published figures (NAB protocol)",
        ("detector", *(f"{part} ({figures['streams']})" for part, figures in parts.items())),
    )
    first = next(iter(parts.values()))
    rows = [
        *(
            (f"{comparison['default']} (default), {protocol} protocol", [p[key]["nab_score"] for p in parts.values()])
            for protocol, key in DEFAULT_FIGURES.items()
        ),
        (f"{comparison['reproduced']}, NAB protocol", [p["reproduced"]["nab_score"] for p in parts.values()]),
        (
            f"{comparison['reproduced']} at the published threshold",
            [p["reproduced_at_published_threshold"]["nab_score"] for p in parts.values()],
        ),
        *((f"{d} (published)", [p["published"][d] for p in parts.values()]) for d in first["published"]),
    ]
    for label, values in rows:
        table.add_row(label, *(_f(v, 1) for v in values))
    console.print(table)


def _render_simulated(result: dict[str, Any]) -> None:
    from iotwatch.cli import output_console

    console = output_console()
    sim = result["simulation"]
    console.print(
        f"Simulated fleet: {sim['devices']} devices ({sim['homes']} homes, {sim['vehicles']} vehicles), "
        f"{sim['days']:g} days, seed {sim['seed']}, {sim['messages']} messages, home readings every "
        f"{sim['home_interval_s']:g} s, vehicle every {sim['vehicle_interval_s']:g} s; "
        f"{sum(sim['anomalies'].values())} anomalies; transport faults {'on' if sim['faults'] else 'off'}"
    )
    goals = result["goals"]
    for name, run in result["configs"].items():
        table = _table(
            f"{name}: alerts vs ground truth (goal: recall >= {goals['recall']}, "
            f"<= {goals['false_alarms_per_device_day']:g} false alarm per device-day, "
            f"median delay <= {goals['median_delay_readings']} readings, drift median delay "
            f"<= {goals['drift_median_delay_s']:g} s)",
            (
                "kind",
                "windows",
                "recall",
                "precision",
                "F1",
                "delay rd med",
                "delay rd p90",
                "delay s med",
                "delay s p90",
                "rule FA/dev-day",
                "detected by",
            ),
            left=("detected by",),
        )
        rows = [*run["kinds"].items(), ("[b]overall[/b]", run["overall"])]
        for label, k in rows:
            table.add_row(
                label,
                f"{k['detected']}/{k['windows']}",
                _f(k["recall"]),
                _f(k["precision"]),
                _f(k["f1"]),
                _f(k["median_delay_readings"], 1),
                _f(k["p90_delay_readings"], 1),
                _f(k["median_delay_s"], 0),
                _f(k["p90_delay_s"], 0),
                _f(k["false_alarms_per_device_day"], 3),
                ", ".join(f"{r} {n}" for r, n in k.get("detected_by", {}).items()),
            )
        console.print(table)
        rules_table = _table(
            f"{name}: raised alerts per rule ({run['overall']['device_days']} device-days)",
            ("rule", "alerts", "true", "related", "false", "precision", "FA/dev-day"),
        )
        for rule, r in run["rules"].items():
            counts = (str(r[key]) for key in ("alerts", "true", "related", "false"))
            rules_table.add_row(rule, *counts, _f(r["precision"]), _f(r["false_alarms_per_device_day"], 3))
        console.print(rules_table)
        met = run.get("goals", {})
        if met:
            console.print(
                f"{name} goals: "
                + ", ".join(
                    f"{goal} {_f(g['value'], 3)} ({'>=' if goal == 'recall' else '<='} {g['goal']:g}: "
                    f"{'met' if g['met'] else 'NOT met'})"
                    for goal, g in met.items()
                )
            )
        overrides = run["overrides"]
        console.print(
            f"{name} settings: "
            + (", ".join(f"{k}={v!r}" for k, v in overrides.items()) if overrides else "the StreamSettings defaults")
        )


def _table(title: str, columns: Sequence[str], left: Collection[str] = (), wrap_first: bool = False) -> Table:
    """A table of figures: right-aligned columns but the first and ``left`` (text)."""
    from rich.table import Table

    table = Table(title=title)
    for i, column in enumerate(columns):
        first = wrap_first and i == 0
        table.add_column(
            column,
            justify="left" if i == 0 or column in left else "right",
            overflow="fold" if first else "ellipsis",
            min_width=20 if first else None,
        )
    return table


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


@click.command("evaluate")
@click.option(
    "--simulated",
    is_flag=True,
    help="Alerts of the streaming job's per-device logic on a simulated fleet, matched to the "
    "simulator's ground truth (current defaults vs recommended settings).",
)
@click.option("--homes", default=20, show_default=True, type=click.IntRange(0), help="--simulated: homes.")
@click.option("--vehicles", default=6, show_default=True, type=click.IntRange(0), help="--simulated: vehicles.")
@click.option(
    "--days",
    default=4.0,
    show_default=True,
    type=click.FloatRange(0.2),
    help="--simulated: event-time days (the detector judges a metric's histograms from its third day, and the "
    "fleet's first two days are a weekend).",
)
@seed_option(Preset(7, "--simulated: simulator seed."))
@click.option(
    "--home-interval",
    "home_interval_s",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0.1),
    help="--simulated: seconds between readings of home devices (the live default is 1).",
)
@click.option(
    "--vehicle-interval",
    "vehicle_interval_s",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0.05),
    help="--simulated: seconds between vehicle readings (live: 0.1).",
)
@click.option(
    "--anomalies-per-day",
    default=2.0,
    show_default=True,
    type=click.FloatRange(0.0),
    help="--simulated: injected anomalies per device-day.",
)
@click.option("--faults", is_flag=True, help="--simulated: inject transport faults too (2 per device-day).")
@click.option(
    "--grace",
    "grace_readings",
    default=3,
    show_default=True,
    type=click.IntRange(0),
    help="--simulated: readings after an anomaly's end an alert still detects it.",
)
@click.option(
    "--dataset",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="NAB-layout directory (data/<group>/<file>.csv, windows.json); default: the NAB sample "
    "shipped with iotwatch (7 streams; pass the whole NAB corpus for figures comparable with "
    "NAB's scoreboard).",
)
@click.option(
    "--readings",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Simulator readings JSONL (use with --truth instead of --dataset).",
)
@click.option(
    "--truth",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Simulator ground-truth JSONL (simulate --ground-truth).",
)
@click.option(
    "--detector",
    "detectors",
    multiple=True,
    type=click.Choice(names()),
    help=f"Detector to evaluate (repeatable; default: {', '.join(DEFAULT_EVALUATED)}); with "
    "--simulated, the job's defaults with this per-metric detector, beside the defaults.",
)
@click.option(
    "--split",
    "split",
    type=click.Choice(["tuning", "held_out"]),
    help="Only the streams of this half of the nab-dev split (evaluation/nab_split.json): "
    "detector parameters were chosen on 'tuning'; 'held_out' checks them.",
)
@click.option(
    "--protocol",
    default="live",
    show_default=True,
    type=click.Choice(PROTOCOLS),
    help="What each detector is told before a stream's first reading: nothing (live, as the job) or "
    "what NAB's base detector gives it (nab: the stream's minimum, maximum and 15 %% probation). The "
    "nab-dev comparison reports the default under both.",
)
@click.option(
    "--profile", default="standard", show_default=True, type=click.Choice(sorted(PROFILES)), help="NAB cost profile."
)
@json_option
def evaluate(
    simulated: bool,
    homes: int,
    vehicles: int,
    days: float,
    seed: int,
    home_interval_s: float,
    vehicle_interval_s: float,
    anomalies_per_day: float,
    faults: bool,
    grace_readings: int,
    dataset: Path | None,
    readings: Path | None,
    truth: Path | None,
    detectors: tuple[str, ...],
    split: str | None,
    protocol: str,
    profile: str,
    as_json: bool,
) -> None:
    """Run detectors over labelled streams; report NAB score, precision/recall/F1,
    detection delay and false alarms per device-day, per stream, group and overall.

    With --simulated: generate a deterministic simulated fleet with injected anomalies, run
    it through the streaming job's per-device logic (rules, detector, alert lifecycle, silence
    timer) and report, per anomaly kind, the recall, precision, F1 and detection delay of the
    raised alerts, and the false alarms per device-day per rule."""
    if simulated:
        if dataset or readings or truth or split:
            raise IotwatchError("--simulated takes no --dataset, --readings, --truth or --split")
        from iotwatch.evaluation.simulated import configurations, evaluate_simulated

        result = evaluate_simulated(
            homes,
            vehicles,
            days,
            seed,
            configs=configurations(detectors),
            grace_readings=grace_readings,
            home_interval_s=home_interval_s,
            vehicle_interval_s=vehicle_interval_s,
            anomalies_per_day=anomalies_per_day,
            faults=faults,
        )
        emit(result, as_json, _render_simulated)
        return
    source: LabelledSource
    if readings or truth:
        if not (readings and truth) or dataset or split:
            raise IotwatchError("give --readings and --truth together, and not with --dataset or --split")
        source = SimulatorSource(readings, truth)
    else:
        dataset = dataset or NAB_SAMPLE
        source = NabSource(dataset, split_keys(split) if split else None)
        if not source.keys():
            raise IotwatchError(f"{dataset} holds none of the streams of the {split} split")
    streams = list(source.streams())
    result = run_evaluation(streams, list(detectors or DEFAULT_EVALUATED), PROFILES[profile], protocol=protocol)
    result = {"dataset": str(dataset or readings), "split": split, "profile": profile, **result}
    if isinstance(source, NabSource):
        from iotwatch.evaluation.published import compare

        result["published_comparison"] = compare(streams, PROFILES[profile])
    emit(result, as_json, _render)
