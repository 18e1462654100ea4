"""The demo's report folder: summary JSON and PNG plots of what the summary says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from devices.catalog import PRIMARY_METRIC  # noqa: E402
from iotwatch.demo.live import LiveState  # noqa: E402


def write_summary(folder: Path, summary: dict[str, Any]) -> Path:
    path = folder / "summary.json"
    path.write_text(json.dumps(summary, indent=2, default=str))
    return path


def plot_stage_rates(folder: Path, live: LiveState) -> Path | None:
    """Messages per second at each stage over the run (from the live samples)."""
    samples = live.samples
    if len(samples) < 3:
        return None
    t0 = samples[0].t
    series = {
        "gateway received (MQTT)": [s.gateway.get("received", 0.0) for s in samples],
        "gateway -> Kafka": [s.gateway.get("forwarded", 0.0) for s in samples],
        "stream job processed": [float(s.stream_offset) for s in samples],
    }
    times = [s.t - t0 for s in samples]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for label, values in series.items():
        rates = [0.0] + [max(0.0, (values[i] - values[i - 1]) / max(times[i] - times[i - 1], 1e-6))
                         for i in range(1, len(values))]
        ax.plot(times, pd.Series(rates).rolling(3, min_periods=1).mean(), label=label)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("messages / s")
    ax.set_title("Per-stage rates")
    ax.grid(alpha=0.3)
    ax.legend()
    path = folder / "stage_rates.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_devices(folder: Path, archive: Path, alerts: list[dict[str, Any]], truth: list[dict[str, Any]],
                 max_devices: int = 4) -> list[Path]:
    """A few devices with injected anomalies: the primary metric, its score, the injected
    window (shaded) and the alerts raised (vertical lines)."""
    root = archive / "readings"
    if not root.exists():
        return []
    anomalies = [t for t in truth if t.get("category") == "anomaly"]
    chosen: list[str] = []
    for item in anomalies:
        if item["device_id"] not in chosen and item["device_type"] in PRIMARY_METRIC:
            chosen.append(item["device_id"])
        if len(chosen) == max_devices:
            break
    if not chosen:
        return []
    frame = pd.read_parquet(root, columns=["device_id", "metric", "event_ms", "value", "score"],
                            filters=[("device_id", "in", chosen)])
    paths = []
    for device in chosen:
        device_type = next(t["device_type"] for t in anomalies if t["device_id"] == device)
        metric = next((t.get("params", {}).get("metric") for t in anomalies
                       if t["device_id"] == device and t.get("params", {}).get("metric")), PRIMARY_METRIC[device_type])
        rows = frame[(frame["device_id"] == device) & (frame["metric"] == metric)].sort_values("event_ms")
        if rows.empty:
            continue
        t0 = rows["event_ms"].iloc[0]
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True,
                                          gridspec_kw={"height_ratios": [2, 1]})
        top.plot((rows["event_ms"] - t0) / 1000, rows["value"], lw=1, label=metric)
        bottom.plot((rows["event_ms"] - t0) / 1000, rows["score"].fillna(0), lw=1, color="tab:orange",
                    label="anomaly score")
        for item in anomalies:
            if item["device_id"] == device:
                for ax in (top, bottom):
                    ax.axvspan((item["start_ts"] - t0) / 1000, (item["end_ts"] - t0) / 1000 + 0.5, color="red",
                               alpha=0.15)
                top.annotate(item["kind"], ((item["start_ts"] - t0) / 1000, rows["value"].max()), fontsize=8)
        for alert in alerts:
            if alert["device_id"] == device and alert["state"] == "raised":
                for ax in (top, bottom):
                    ax.axvline((alert["first_event_ms"] - t0) / 1000, color="black", ls="--", lw=0.8)
        top.set_title(f"{device} ({device_type}): shaded = injected anomaly, dashed = alert raised")
        top.legend(loc="upper left")
        bottom.legend(loc="upper left")
        bottom.set_ylim(0, 1.05)
        bottom.set_xlabel("event time, seconds")
        path = folder / f"device_{device}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
