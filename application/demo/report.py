"""The demo's report folder: its alerts and PNG plots of what the summary says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import pandas as pd

from iotwatch.application.harness.probe import LiveState
from iotwatch.application.harness.results import save_figure
from iotwatch.contract.alerts import AlertRecord, alert_as_dict
from iotwatch.contract.ground_truth import Injection
from iotwatch.contract.metric_catalog import PRIMARY_METRIC
from iotwatch.evaluation.judgement import END_OF_RUN, FALSE_ALARM, RELATED, TRUE


def write_alerts(folder: Path, alerts: list[AlertRecord], verdicts: dict[str, str]) -> Path:
    """Every alert record of the run, raised ones with their verdict against the ground truth."""
    path = folder / "alerts.jsonl"
    with path.open("w") as out:
        for alert in alerts:
            verdict = verdicts.get(alert.alert_id) if alert.raised else None
            record = alert_as_dict(alert)
            out.write(json.dumps({**record, "verdict": verdict} if verdict else record) + "\n")
    return path


def plot_closed_loop(folder: Path, found: dict[str, list[int]]) -> Path | None:
    """The closed loop's timings per command (alert -> command -> device ack -> alert cleared),
    one strip each with its p50 and p99 marked; None when no command was sent."""
    series = [(name.replace("_", " "), [v / 1000.0 for v in values]) for name, values in found.items()]
    if not any(values for _, values in series):
        return None
    fig, ax = plt.subplots(figsize=(9, 3.5))
    for row, (_label, values) in enumerate(series):
        if not values:
            continue
        ax.scatter(values, [row] * len(values), alpha=0.6, s=24)
        for q, marker in ((50, "|"), (99, "x")):
            ax.scatter([pd.Series(values).quantile(q / 100)], [row + 0.25], marker=marker, s=90, color="black")
    ax.set_yticks(range(len(series)), [f"{label} (n={len(values)})" for label, values in series])
    ax.set_ylim(-0.5, len(series) - 0.3)
    ax.set_xlabel("seconds (wall clock); | p50, x p99")
    ax.set_title("Closed loop: alert -> command -> device ack -> alert cleared")
    ax.grid(alpha=0.3, axis="x")
    return save_figure(fig, folder / "closed_loop.png")


def plot_stage_rates(folder: Path, live: LiveState) -> Path | None:
    """Messages per second at each stage over the run (from the live samples)."""
    samples = live.samples
    if len(samples) < 3:
        return None
    t0 = samples[0].t
    series = {
        "gateway received (MQTT)": [s.gateway.get("received", 0.0) for s in samples],
        "gateway -> Kafka": [s.gateway.get("forwarded", 0.0) for s in samples],
        "stream job processed (as each micro-batch commits)": [float(s.stream_offset) for s in samples],
    }
    times = [s.t - t0 for s in samples]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for label, values in series.items():
        rates = [0.0] + [
            max(0.0, (values[i] - values[i - 1]) / max(times[i] - times[i - 1], 1e-6)) for i in range(1, len(values))
        ]
        ax.plot(times, pd.Series(rates).rolling(3, min_periods=1).mean(), label=label)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("messages / s")
    ax.set_title("Per-stage rates")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, folder / "stage_rates.png")


#: How an alert is drawn in the device plots, by its verdict (:mod:`iotwatch.evaluation.judgement`).
ALERT_STYLE = {
    TRUE: ("tab:green", "--"),
    RELATED: ("tab:olive", "--"),
    FALSE_ALARM: ("tab:red", "--"),
    END_OF_RUN: ("grey", ":"),
}


#: The metric that shows a physical anomaly best (measurement anomalies name theirs).
KIND_METRIC = {"crash": "accel_x_g", "harsh_braking": "accel_x_g"}


def choose_devices(anomalies: list[Injection], max_devices: int) -> list[tuple[str, str]]:
    """(device, metric) to plot: planned anomalies first, then one device per anomaly kind
    (earliest first), then more; the metric is the one the choosing anomaly changed."""
    eligible = sorted(
        (a for a in anomalies if a.device_type in PRIMARY_METRIC),
        key=lambda a: (a.source != "scenario", a.start_ts),
    )
    chosen: dict[str, str] = {}
    kinds: set[str] = set()
    for fresh_kind_only in (True, False):
        for item in eligible:
            if item.device_id in chosen or (fresh_kind_only and item.kind in kinds):
                continue
            chosen[item.device_id] = (
                item.params.get("metric") or KIND_METRIC.get(item.kind) or PRIMARY_METRIC[item.device_type]
            )
            kinds.update(a.kind for a in eligible if a.device_id == item.device_id)
    return list(chosen.items())[:max_devices]


def _metric_rows(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One metric of the archive's readings (a struct field, or an uncatalogued extra):
    ``seq``, ``value`` and ``score``, for the readings that carry it."""

    def value(row: Any) -> float | None:
        found = (row.metrics or {}).get(metric)
        return found if found is not None else dict(row.extra_metrics or ()).get(metric)

    rows = pd.DataFrame(
        {
            "seq": frame["seq"].to_numpy(),
            "value": [value(r) for r in frame.itertuples(index=False)],
            "score": [(s or {}).get(metric) for s in frame["scores"]],
        }
    )
    return rows.dropna(subset=["value"])


def plot_devices(
    folder: Path,
    archive: Path,
    alerts: list[AlertRecord],
    truth: list[Injection],
    verdicts: dict[str, str],
    max_devices: int = 4,
) -> list[Path]:
    """A few devices with injected anomalies: the anomalous metric, its score, the injected
    windows (shaded) and the alerts raised (vertical lines coloured by their verdict against
    the ground truth). The x axis is the reading's seq, which clock-skew faults leave alone;
    readings that never arrived (dropouts) or were dropped as late leave gaps."""
    root = archive / "readings"
    if not root.exists():
        return []
    anomalies = [t for t in truth if t.is_anomaly]
    chosen = choose_devices(anomalies, max_devices)
    if not chosen:
        return []
    frame = pd.read_parquet(
        root,
        columns=["device_id", "seq", "metrics", "scores", "extra_metrics"],
        filters=[("device_id", "in", [device for device, _ in chosen])],
    )
    paths = []
    for device, metric in chosen:
        own = [t for t in anomalies if t.device_id == device]
        device_type = own[0].device_type
        rows = _metric_rows(frame[frame["device_id"] == device], metric)
        if rows.empty:
            continue
        rows = rows.drop_duplicates("seq").set_index("seq").sort_index()
        rows = rows.reindex(range(int(rows.index.min()), int(rows.index.max()) + 1))  # NaN: a gap in the line
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
        top.plot(rows.index, rows["value"], lw=1, label=metric)
        bottom.plot(rows.index, rows["score"], lw=1, color="tab:orange", label="anomaly score")
        for item in own:
            for ax in (top, bottom):
                ax.axvspan(item.start_seq - 0.5, item.end_seq + 0.5, color="red", alpha=0.15)
            top.annotate(item.kind, (item.start_seq, rows["value"].max()), fontsize=8, va="top")
        for alert in alerts:
            if alert.device_id == device and alert.raised:
                colour, style = ALERT_STYLE.get(verdicts.get(alert.alert_id, ""), ("black", "--"))
                for ax in (top, bottom):
                    ax.axvline(alert.start_seq, color=colour, ls=style, lw=1)
                bottom.annotate(
                    alert.rule,
                    (alert.start_seq, 1.0),
                    fontsize=7,
                    rotation=90,
                    va="top",
                    ha="right",
                    color=colour,
                )
        top.set_title(
            f"{device} ({device_type}): shaded = injected anomaly; alert raised: green = detection, "
            "olive = related to an anomaly, red = false alarm, grey = end of run",
            fontsize=9,
        )
        top.legend(loc="upper left")
        bottom.legend(loc="upper left")
        bottom.set_ylim(0, 1.05)
        bottom.set_xlabel("reading (seq)")
        paths.append(save_figure(fig, folder / f"device_{device}.png"))
    return paths
