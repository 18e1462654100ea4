"""Runs a simulation against a broker: pacing, worker processes, progress and summary
(docs/internals.md, "Broker runs")."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import resource
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from iotwatch.contract.ground_truth import write_ground_truth
from iotwatch.devices import seq_state
from iotwatch.devices.commands import CommandChannel, DeviceCommands
from iotwatch.devices.config import RunOptions, SimConfig
from iotwatch.devices.fleet import fleet_rate
from iotwatch.devices.publisher import Publisher
from iotwatch.devices.simulation import Simulation
from iotwatch.stats import quantiles

log = logging.getLogger(__name__)

__all__ = ["RunOptions", "run"]

_COUNTERS = 4  # per worker: sent, errors, readings, status
_LATENCY_SAMPLES = 200_000


def _shard_quota(count: int | None, shard: int, shards: int) -> int | None:
    if count is None:
        return None
    return count // shards + (1 if shard < count % shards else 0)


def _run_shard(
    config: SimConfig,
    options: RunOptions,
    shard: int,
    shards: int,
    counters: Any,
    stop: Any,
    announce: str | None = None,
) -> dict[str, Any]:
    """One shard from connect to disconnect; returns its partial summary. ``announce`` is
    logged once connected (what the run does, where)."""
    sim = Simulation(config, shard, shards, count_limit=_shard_quota(config.count, shard, shards))
    devices = [
        (int(uid), topic) for g in sim.groups for uid, topic in zip(g.uid.tolist(), g.status_topics, strict=True)
    ]
    prefix = options.client_prefix and f"{options.client_prefix}-{shard}"
    publisher = Publisher(
        options.mqtt,
        qos=options.qos,
        connections=options.connections,
        device_uids=[uid for uid, _ in devices] if options.per_device else None,
        device_status=dict(devices) if options.per_device else None,
        client_prefix=prefix,
        max_inflight=options.max_inflight,
    )
    publisher.connect()
    if announce:
        log.info("%s", announce)
    commands = _command_handler(sim, options, shard) if options.obey_commands else None
    if options.qos:
        # paho's network threads must get the GIL often enough to handle PUBACKs while
        # this thread generates; the default 5 ms switch interval makes acks wait
        sys.setswitchinterval(0.0005)
    base = shard * _COUNTERS
    lags: list[float] = []  # paced runs: how long after its due time each tick was handed to the connections
    try:
        publisher.publish_status(devices, online=True)
        stop_ms = config.start_ms + int(config.duration_s * 1000) if config.duration_s is not None else None
        wall0 = time.monotonic()
        first_publish = None
        pace = 0.0 if options.as_fast_as_possible else 1.0 / (1000.0 * options.speedup)
        due = wall0
        while not stop.is_set() and not sim.exhausted and (stop_ms is None or sim.now_ms < stop_ms):
            if pace:
                due = wall0 + (sim.now_ms - config.start_ms) * pace
                delay = due - time.monotonic()
                if delay > 0:
                    stop.wait(delay)
                    if stop.is_set():
                        break
            if commands is not None:
                commands.handle_pending()
            batch = sim.tick()
            if first_publish is None and batch:
                first_publish = time.monotonic()
            publisher.publish(batch)
            if pace and batch:
                lags.append(time.monotonic() - due)
            counters[base], counters[base + 1] = publisher.sent, publisher.errors
            counters[base + 2], counters[base + 3] = sim.readings, publisher.status_sent
        publisher.publish(sim.finish())
        if not sim.exhausted:  # stopped, or its duration is over: the devices say goodbye
            publisher.publish(sim.goodbye())
        publisher.flush()
        wall = time.monotonic() - (first_publish or wall0)
        publisher.publish_status(devices, online=False)
        publisher.flush()
    finally:
        publisher.close()
        if commands is not None:
            commands.channel.close()
    counters[base], counters[base + 1] = publisher.sent, publisher.errors
    counters[base + 2], counters[base + 3] = sim.readings, publisher.status_sent
    latencies = publisher.latencies_ms()
    if len(latencies) > _LATENCY_SAMPLES:
        latencies = list(np.random.default_rng(0).choice(latencies, _LATENCY_SAMPLES, replace=False))
    return {
        "sent": publisher.sent,
        "errors": publisher.errors,
        "status_messages": publisher.status_sent,
        "readings": sim.readings,
        "withheld": sim.withheld,
        "extra_copies": sim.extra_copies,
        "unacked": publisher.unacked(),
        "wall_s": wall,
        "by_device_type": {sim.type_names[g]: n for g, n in publisher.by_group.items()},
        "devices": dict(sim.fleet.device_counts),
        "events": dict(sim.events),
        "anomalies": dict(sim.injector.started),
        "records": sim.injector.records,
        "virtual_end_ms": sim.now_ms,
        "connections": publisher.connections,
        "latencies": latencies,
        "tick_lags": lags,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "seq_end": sim.seq_end(),
        "carried_on": sim.carried_on,
        "commands": commands.counts if commands is not None else {},
    }


def _command_handler(sim: Simulation, options: RunOptions, shard: int) -> DeviceCommands:
    """The shard's command session; its client id is fixed by --client-id-prefix, so a restarted
    simulator resumes the session and gets the commands sent while it was away."""
    devices = [
        (site, g.device_type, device_id)
        for g in sim.groups
        for site, device_id in zip(g.sites, g.device_ids, strict=True)
    ]
    channel = CommandChannel(options.mqtt, f"{options.client_prefix or 'iotwatch-sim'}-commands-{shard}", devices)
    channel.connect()
    handler = DeviceCommands(channel, sim.obey, reported=sim.reported)
    handler.report_all()
    return handler


def _worker(
    config: SimConfig, options: RunOptions, shard: int, shards: int, counters: Any, stop: Any, results: Any
) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # the parent decides when to stop
    try:
        results.put((shard, _run_shard(config, options, shard, shards, counters, stop)))
    except BaseException as exc:
        results.put((shard, {"error": f"{type(exc).__name__}: {exc}"}))


class _Progress:
    """The live progress line (rich, on stderr)."""

    def __init__(self, enabled: bool, target_rate: float | None, counters: Any, shards: int) -> None:
        self.enabled = enabled
        self.target_rate = target_rate
        self.counters = counters
        self.shards = shards
        self.started = time.monotonic()
        self._live: Any = None
        self._last = (self.started, 0)
        self._rate = 0.0

    def totals(self) -> tuple[int, int, int]:
        c = self.counters
        sent = sum(int(c[s * _COUNTERS]) for s in range(self.shards))
        errors = sum(int(c[s * _COUNTERS + 1]) for s in range(self.shards))
        readings = sum(int(c[s * _COUNTERS + 2]) for s in range(self.shards))
        return sent, errors, readings

    def __rich__(self) -> Any:
        from rich.text import Text

        sent, errors, readings = self.totals()
        now = time.monotonic()
        then, before = self._last
        if now - then >= 0.5:
            self._rate = (sent - before) / (now - then)
            self._last = (now, sent)
        target = f"{self.target_rate:,.0f}/s" if self.target_rate else "max"
        return Text(
            f"simulate  {now - self.started:6.1f}s  target {target}  achieved {self._rate:,.0f}/s  "
            f"sent {sent:,}  readings {readings:,}  errors {errors:,}"
        )

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self, console=Console(stderr=True), refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)


def default_start_ms(config: SimConfig, options: RunOptions) -> int:
    """Now for real-time runs; for accelerated ones, early enough that the virtual clock
    ends about now (so event times are never in the future)."""
    now = int(time.time() * 1000)
    if options.speedup == 1.0 and not options.as_fast_as_possible:
        return now
    span_s = config.duration_s
    if span_s is None and config.count is not None:
        rate, _ = fleet_rate(config)
        span_s = config.count / (config.target_rate or rate or 1.0)
    return now - int((span_s or 0.0) * 1000)


#: What ends a run early, with its summary: Ctrl-C and SIGTERM, to the process or its group.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """While inside: :data:`STOP_SIGNALS` set ``stop`` (in the main thread; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: stop.set())
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _announcement(
    config: SimConfig, options: RunOptions, device_counts: dict[str, int], target_rate: float | None
) -> str:
    """What a run does and where, said on start."""
    fleet = ", ".join(f"{n} {t}" for t, n in sorted(device_counts.items()) if n) or "replayed streams"
    rate = "as fast as possible" if target_rate is None else f"{target_rate:,.1f} msg/s"
    speed = f" (event time x{options.speedup:g})" if options.speedup != 1 else ""
    if config.duration_s is not None:
        length = f"for {config.duration_s:g} s of event time"
    elif config.count is not None:
        length = f"for {config.count:,} readings"
    else:
        length = "until stopped"
    where = f"publishing to MQTT {options.mqtt.url} at {rate}{speed}"
    return f"simulate: {fleet} {where}, {length}; Ctrl-C or SIGTERM stops"


def run(config: SimConfig, options: RunOptions) -> dict[str, Any]:
    """Run the simulation, return the summary (and write the ground truth)."""
    processes = max(1, options.processes)
    fleet_msgs, device_counts = fleet_rate(config)
    target_rate = None if options.as_fast_as_possible else (config.target_rate or fleet_msgs) * options.speedup
    started = time.monotonic()
    announce = _announcement(config, options, device_counts, target_rate)
    if processes == 1:
        counters: Any = [0] * _COUNTERS
        stop: Any = threading.Event()
        with _stopped_by_signals(stop):
            with _Progress(options.progress, target_rate, counters, 1):
                parts = [_run_shard(config, options, 0, 1, counters, stop, announce)]
        interrupted = stop.is_set()
    else:
        ctx = mp.get_context("spawn")
        counters = ctx.Array("q", processes * _COUNTERS, lock=False)
        stop = ctx.Event()
        results = ctx.Queue()
        workers = [
            ctx.Process(
                target=_worker,
                args=(config, options, shard, processes, counters, stop, results),
                name=f"iotwatch-sim-{shard}",
                daemon=True,
            )
            for shard in range(processes)
        ]
        for worker in workers:
            worker.start()
        log.info("%s (%d processes)", announce, processes)
        collected: dict[int, dict[str, Any]] = {}
        signalled = threading.Event()
        with _stopped_by_signals(signalled), _Progress(options.progress, target_rate, counters, processes):
            while len(collected) < processes:
                if signalled.is_set():
                    stop.set()
                try:
                    shard, part = results.get(timeout=0.2)
                    collected[shard] = part
                    if "error" in part:
                        stop.set()
                except queue.Empty:
                    if not any(w.is_alive() for w in workers) and results.empty():
                        break
        interrupted = signalled.is_set()
        for worker in workers:
            worker.join(timeout=10)
        errors = [p["error"] for p in collected.values() if "error" in p]
        if errors:
            raise RuntimeError(f"simulator worker failed: {errors[0]}")
        if len(collected) < processes:
            raise RuntimeError(f"{processes - len(collected)} simulator worker(s) died without a result")
        parts = [collected[s] for s in sorted(collected)]
    summary = _merge(parts, config, options, target_rate, time.monotonic() - started, device_counts)
    summary["interrupted"] = interrupted
    if config.seq_state is not None:
        ends = {device: end for part in parts for device, end in part["seq_end"].items()}
        seq_state.save(config.seq_state, ends)
        summary["seq_state"] = {
            "path": str(config.seq_state),
            "carried_on": sum(p["carried_on"] for p in parts),
            "saved": len(ends),
        }
    if options.ground_truth is not None:
        records = [r for p in parts for r in p["records"]]
        summary["ground_truth"] = {
            "path": str(options.ground_truth),
            "records": write_ground_truth(options.ground_truth, records),
        }
    return summary


def _merge(
    parts: list[dict[str, Any]],
    config: SimConfig,
    options: RunOptions,
    target_rate: float | None,
    elapsed: float,
    device_counts: dict[str, int],
) -> dict[str, Any]:
    def total(key: str) -> dict[str, int]:
        merged: dict[str, int] = {}
        for part in parts:
            for name, n in part[key].items():
                merged[name] = merged.get(name, 0) + n
        return dict(sorted(merged.items()))

    sent = sum(p["sent"] for p in parts)
    wall = max(p["wall_s"] for p in parts) or 1e-9
    latencies = np.array([x for p in parts for x in p["latencies"]], dtype=np.float64)
    latency = None
    if options.qos == 1 and len(latencies):
        figures = quantiles(latencies, (0.5, 0.99), digits=3)
        latency = {
            "p50_ms": figures["p50"],
            "p99_ms": figures["p99"],
            "max_ms": round(float(latencies.max()), 3),
            "samples": int(len(latencies)),
        }
    virtual_end = max(p["virtual_end_ms"] for p in parts)
    lags = np.array([x for p in parts for x in p["tick_lags"]], dtype=np.float64)
    tick_lag = None
    if len(lags):
        figures = quantiles(lags, (0.5, 0.99), digits=4)
        tick_lag = {"p50_s": figures["p50"], "p99_s": figures["p99"], "max_s": round(float(lags.max()), 4)}
        tick_lag["ticks"] = int(len(lags))
    return {
        "sent": sent,
        "errors": sum(p["errors"] for p in parts),
        "readings": sum(p["readings"] for p in parts),
        "withheld": sum(p["withheld"] for p in parts),
        "extra_copies": sum(p["extra_copies"] for p in parts),
        "status_messages": sum(p["status_messages"] for p in parts),
        "unacked": sum(p["unacked"] for p in parts),
        "by_device_type": total("by_device_type"),
        "devices": total("devices"),
        "device_total": sum(total("devices").values()),
        "achieved_rate": round(sent / wall, 1),
        "target_rate": None if target_rate is None else round(target_rate, 1),
        "wall_s": round(wall, 3),
        "elapsed_s": round(elapsed, 3),
        "qos": options.qos,
        "publish_latency": latency,
        "tick_lag": tick_lag,
        "peak_rss_mb": round(max(p["rss_mb"] for p in parts), 1),
        "processes": max(1, options.processes),
        "connections": sum(p["connections"] for p in parts),
        "seed": config.seed,
        "start_ms": config.start_ms,
        "virtual_end_ms": virtual_end,
        "virtual_s": round((virtual_end - config.start_ms) / 1000.0, 3),
        "speedup": None if options.as_fast_as_possible else options.speedup,
        "events": total("events"),
        "anomalies": total("anomalies"),
        "commands": total("commands"),
        "pid": os.getpid(),
    }
