"""The chaos run's report folder: plots over time with the faults marked
(each fault shaded from injection until its target was back, a dotted line at recovery)."""

from __future__ import annotations

from dataclasses import astuple, fields
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from iotwatch.application.chaos.faults import FaultRecord
from iotwatch.application.chaos.resources import Sample, Sampler
from iotwatch.application.chaos.summary import ChaosReport
from iotwatch.application.harness.accounting import RawIndex
from iotwatch.application.harness.probe import LiveState
from iotwatch.application.harness.results import save_figure


def write(
    folder: Path,
    live: LiveState,
    sampler: Sampler,
    faults: list[FaultRecord],
    started: float,
    raw: RawIndex,
    loss: int,
) -> ChaosReport:
    """Plots and the samples as CSV in ``folder``; returns where they are (for the summary)."""
    folder.mkdir(parents=True, exist_ok=True)
    plots = [
        plot_pipeline(folder / "pipeline.png", live, faults, started, loss),
        plot_latency(folder / "latency.png", raw, faults, started),
        plot_resources(folder / "resources.png", sampler, faults),
    ]
    return ChaosReport(
        folder=str(folder),
        plots=[str(p) for p in plots if p],
        resources_csv=str(write_resource_samples(folder / "resources.csv", sampler)),
        pipeline_csv=str(write_pipeline_samples(folder / "pipeline.csv", live, started)),
    )


def mark_faults(ax: Any, faults: list[FaultRecord], label: bool = False) -> None:
    for record in faults:
        if record.injected_s is None:
            continue
        end = record.restored_s if record.restored_s is not None else record.injected_s + 1
        ax.axvspan(record.injected_s, end, color="red", alpha=0.12)
        if record.recovered_s is not None:
            ax.axvline(record.recovered_s, color="green", ls=":", lw=0.8)
        if label:
            ax.annotate(
                record.planned.kind.name,
                (record.injected_s, 1.0),
                xycoords=("data", "axes fraction"),
                rotation=90,
                fontsize=7,
                va="top",
                ha="right",
            )


def plot_pipeline(path: Path, live: LiveState, faults: list[FaultRecord], started: float, loss: int) -> Path | None:
    """Lag (raw topic end minus what the job committed), stage rates and the gateway's in-flight."""
    samples = live.samples
    if len(samples) < 3:
        return None
    t = np.array([s.t - started for s in samples])
    raw = np.array([s.raw_end for s in samples], dtype=float)
    done = np.array([s.stream_offset for s in samples], dtype=float)
    inflight = [s.gateway.get("inflight", np.nan) for s in samples]
    fig, (lag_ax, rate_ax, gw_ax) = plt.subplots(3, 1, figsize=(12, 8), sharex=True)
    lag_ax.plot(t, np.maximum(raw - done, 0), lw=1)
    lag_ax.set_ylabel("lag (records)")
    lag_ax.set_title(f"Pipeline under faults (shaded: target down or paused; dotted: recovered); loss {loss}")
    for label, values in (("raw topic appended", raw), ("job committed", done)):
        rates = np.diff(values, prepend=values[0]) / np.maximum(np.diff(t, prepend=t[0] - 1), 1e-6)
        rate_ax.plot(t, pd.Series(np.maximum(rates, 0)).rolling(5, min_periods=1).mean(), lw=1, label=label)
    rate_ax.set_ylabel("records / s")
    rate_ax.legend(loc="upper left")
    gw_ax.plot(t, inflight, lw=1)
    gw_ax.set_ylabel("gateway in flight")
    gw_ax.set_xlabel("seconds since the load started")
    for ax in (lag_ax, rate_ax, gw_ax):
        mark_faults(ax, faults, label=ax is lag_ax)
        ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_latency(path: Path, raw: RawIndex, faults: list[FaultRecord], started: float) -> Path | None:
    """Device to raw topic latency (the reading's time to its append), p50 and p99 per 5 s."""
    if not raw.readings:
        return None
    appended, event = raw.appended_ms, raw.event_ms
    frame = pd.DataFrame({"bin": (appended / 1000.0 - started) // 5 * 5, "latency_s": (appended - event) / 1000.0})
    stats = frame.groupby("bin")["latency_s"].quantile(np.array([0.5, 0.99])).unstack()
    fig, ax = plt.subplots(figsize=(12, 4))
    ax.plot(stats.index, stats[0.5], lw=1, label="p50")
    ax.plot(stats.index, stats[0.99], lw=1, label="p99")
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_ylabel("device -> raw topic (s)")
    ax.set_xlabel("seconds since the load started (by append time)")
    ax.set_title("Reading latency to Kafka under faults")
    mark_faults(ax, faults, label=True)
    ax.legend(loc="upper right")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def write_pipeline_samples(path: Path, live: LiveState, started: float) -> Path:
    """Every sample of the pipeline (seconds since the load started, the raw topic's end and
    the job's committed offset summed over partitions, and the lag between them), so the lag
    proof can be checked against the series it judged."""
    rows = [(x.t - started, x.raw_end, x.stream_offset, max(0, x.raw_end - x.stream_offset)) for x in live.samples]
    pd.DataFrame(rows, columns=["t", "raw_end", "stream_offset", "lag"]).to_csv(path, index=False)
    return path


def write_resource_samples(path: Path, sampler: Sampler) -> Path:
    """Every resource sample (seconds since the load started, process, pid, RSS, fds, threads
    outside and inside the bounded pools, anonymous resident bytes, data files held open), so
    growth can be examined beyond the summary's slopes."""
    columns = ["t", "process", "pid", "rss_bytes", "fds", "threads", "pooled_threads", "anon_bytes", "data_files"]
    sample_frame(sampler)[columns].to_csv(path, index=False)
    return path


def sample_frame(sampler: Sampler) -> pd.DataFrame:
    """The resource samples as a table, a column per :class:`Sample` field."""
    return pd.DataFrame([astuple(s) for s in sampler.samples], columns=[f.name for f in fields(Sample)])


def plot_resources(path: Path, sampler: Sampler, faults: list[FaultRecord]) -> Path | None:
    """RSS, open file descriptors and threads of every process tree over the run."""
    if not sampler.samples:
        return None
    frame = sample_frame(sampler)
    fig, axes = plt.subplots(3, 1, figsize=(12, 10), sharex=True)
    for ax, column, scale, unit in (
        (axes[0], "rss_bytes", 2**20, "RSS (MiB)"),
        (axes[1], "fds", 1, "open fds (data files apart)"),
        (axes[2], "threads", 1, "threads (bounded pools apart)"),
    ):
        for name, rows in frame.groupby("process"):
            ax.plot(rows["t"], rows[column] / scale, lw=1, label=str(name))
        ax.set_ylabel(unit)
        mark_faults(ax, faults)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].legend(loc="upper left", fontsize=7, ncol=4)
    axes[0].set_title("Resources per process (children included) with the faults shaded")
    axes[2].set_xlabel("seconds since the load started")
    return save_figure(fig, path)
