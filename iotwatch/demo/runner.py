"""``iotwatch demo``: the whole product on the embedded stack, start to finish.

Starts the stack, the streaming job, the gateway and the simulators (homes and vehicles
with injected anomalies and transport faults, ground truth written), shows a live view,
then drains every stage, accounts for every reading by seq, matches alerts to the ground
truth and writes a report folder. Everything it started is stopped, on Ctrl-C too.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from devices.catalog import DEFAULT_INTERVAL_S
from devices.ground_truth import read_ground_truth
from gateway.metrics import wait_healthy
from iotwatch.deadletter import H_REASON, H_STAGE, header_value
from iotwatch.demo import accounting, report
from iotwatch.demo.live import LiveState, Probe, render
from iotwatch.errors import IotwatchError
from iotwatch.settings import Settings
from iotwatch.stack import EmbeddedStack
from iotwatch.stack.process import free_port

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoOptions:
    duration_s: float
    homes: int
    vehicles: int
    speedup: float
    anomaly_rate: float
    fault_rate: float
    seed: int
    out: Path


class Child:
    """A component run as its own process (as in production), output to the run folder."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], folder: Path) -> None:
        self.name = name
        self.stdout_path = folder / f"{name}.json"
        self.log_path = folder / f"{name}.log"
        self.process = subprocess.Popen(command, env=env, stdout=open(self.stdout_path, "wb"),
                                        stderr=open(self.log_path, "wb"), start_new_session=True)

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 90.0) -> dict[str, Any]:
        """SIGTERM (the components drain and print their summary), SIGKILL if it hangs."""
        if self.running():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        return self.result()

    def result(self) -> dict[str, Any]:
        text = self.stdout_path.read_text().strip()
        start = text.rfind("\n{")
        try:
            return json.loads(text[start + 1:] if start >= 0 else text) if text else {}
        except ValueError:
            return {"unparsed_output": text[-500:]}


def _iotwatch(*args: str) -> list[str]:
    return [sys.executable, "-m", "iotwatch", "--log-level", "WARNING", *args]


def run_demo(settings: Settings, options: DemoOptions, console: Console) -> dict[str, Any]:
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    stack = EmbeddedStack(settings, out / "stack")
    children: list[Child] = []
    try:
        state = stack.up()
        settings = state.apply_to(settings)
        if state.services.get("influx") is None:
            console.print("[yellow]InfluxDB is not installed: metrics go to the report only "
                          "(apt-get install -y influxdb for dashboards)[/yellow]")
        checkpoint, archive, truth_path = out / "checkpoint", out / "archive", out / "ground_truth.jsonl"
        gateway_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("IOTWATCH_")}
        env.update(state.env())
        # Event time runs `speedup` times faster than the wall clock: silence is judged in wall time.
        env.update(IOTWATCH_STREAM_CHECKPOINT_DIR=str(checkpoint), IOTWATCH_STREAM_ARCHIVE_DIR=str(archive),
                   IOTWATCH_STREAM_SILENCE_TIMEOUT_S=str(max(5.0, 30.0 / options.speedup)),
                   IOTWATCH_REGISTRY_PATH=str(out / "registry"))
        console.print(f"stack up in {out / 'stack'}; starting the streaming job, the gateway and the simulators")
        children.append(Child("stream", _iotwatch("stream", "--trigger", "2", "--json"), env, out))
        children.append(Child("gateway", _iotwatch("gateway", "--client-id", "demo-gateway", "--metrics-port",
                                                   str(gateway_port), "--json"), env, out))
        wait_healthy(gateway_port, timeout_s=60)
        simulator = Child("simulate", _iotwatch(
            "simulate", "--homes", str(options.homes), "--vehicles", str(options.vehicles),
            "--duration", str(options.duration_s * options.speedup), "--speedup", str(options.speedup),
            "--anomaly-rate", str(options.anomaly_rate), "--fault-rate", str(options.fault_rate),
            "--seed", str(options.seed), "--ground-truth", str(truth_path), "--no-progress", "--json"), env, out)
        children.append(simulator)
        live = LiveState()
        probe = Probe(settings, gateway_port, checkpoint)
        started = time.time()
        interrupted = False
        try:
            with Live(render(live, started, options.duration_s, "running"), console=console,
                      refresh_per_second=2, transient=False) as view:
                while simulator.running():
                    probe.sample(live)
                    view.update(render(live, started, options.duration_s, "running"))
                    time.sleep(1.0)
                drained = _drain(probe, live, view, started, options, children)
        except KeyboardInterrupt:
            interrupted, drained = True, False
            console.print("[yellow]interrupted: stopping everything[/yellow]")
        finally:
            probe.close()
        results = {child.name: child.stop() for child in reversed(children)}
        return _summarise(settings, options, results, live, drained, interrupted, checkpoint, archive, truth_path)
    finally:
        for child in children:
            child.stop(timeout_s=30)
        stack.down()


def _drain(probe: Probe, live: LiveState, view: Live, started: float, options: DemoOptions,
           children: list[Child], timeout_s: float = 300.0) -> bool:
    """After the simulators end: wait until the gateway has nothing in flight and the job
    has processed everything in the raw topic (its newest committed batch reached the log end)."""
    deadline = time.monotonic() + timeout_s
    caught_up_since: float | None = None
    while time.monotonic() < deadline:
        sample = probe.sample(live)
        view.update(render(live, started, options.duration_s, "draining"))
        if not all(child.running() for child in children if child.name != "simulate"):
            return False
        # The gateway is the raw topic's only producer here, so what it forwarded is the log end
        # (the embedded broker's ListOffsets answer can lag behind the real end).
        # (forwarded counts dead letters too; those went to the dead-letter topic).
        forwarded = int(sample.gateway.get("forwarded", 0) - sample.gateway.get("dead_lettered", 0))
        idle = sample.gateway.get("inflight", 1) == 0 and sample.stream_offset >= max(forwarded, sample.raw_end) > 0
        caught_up_since = (caught_up_since or time.monotonic()) if idle else None
        if caught_up_since is not None and time.monotonic() - caught_up_since >= 8:
            return True
        time.sleep(1.0)
    return False


def _summarise(settings: Settings, options: DemoOptions, results: dict[str, Any], live: LiveState, drained: bool,
               interrupted: bool, checkpoint: Path, archive: Path, truth_path: Path) -> dict[str, Any]:
    truth = read_ground_truth(truth_path) if truth_path.exists() else []
    late: dict[str, set[int]] = {}
    dead_reasons: dict[str, int] = {}
    for record in accounting.read_all(settings.kafka, settings.topics.dlq):
        key = f"{header_value(record.headers(), H_STAGE)}:{header_value(record.headers(), H_REASON)}"
        dead_reasons[key] = dead_reasons.get(key, 0) + 1
        if key == "stream:late":
            body = json.loads(record.value())
            late.setdefault(body["device_id"], set()).add(int(body["seq"]))
    raw_records = accounting.read_all(settings.kafka, settings.topics.raw)
    raw_seqs, unparseable = accounting.seqs_by_device(raw_records)
    appended = accounting.append_times(raw_records)
    alert_records = accounting.read_all(settings.kafka, settings.topics.alerts)
    alerts = [json.loads(r.value()) for r in alert_records]
    # Latency of the pipeline after the gateway: the triggering reading's append to the raw
    # topic -> the alert's append to the alert topic (wall clock; event time may be accelerated).
    latencies = sorted(r.timestamp()[1] - appended[(a["device_id"], a["seq"])] for r, a in zip(alert_records, alerts)
                       if a.get("state") == "raised" and (a["device_id"], a.get("seq")) in appended)
    loss = accounting.account(raw_seqs, accounting.archived_seqs(archive), late, truth)
    intervals = {kind: int(seconds * 1000) for kind, seconds in DEFAULT_INTERVAL_S.items()}
    detection = accounting.match_alerts(alerts, truth, intervals)
    simulator, gateway, stream = results.get("simulate", {}), results.get("gateway", {}), results.get("stream", {})
    summary = {
        "options": {k: str(v) for k, v in options.__dict__.items()},
        "completed": drained and not interrupted,
        "messages": {
            "simulated": simulator.get("sent"), "simulated_readings": simulator.get("readings"),
            "gateway_received": gateway.get("received"), "gateway_forwarded": gateway.get("forwarded"),
            "gateway_dead_lettered": gateway.get("dead_lettered"),
            "kafka_raw_unique_readings": loss["unique_readings_in_kafka"], "kafka_raw_unparseable": unparseable,
            "stream": stream.get("totals", {}),
        },
        "dead_letters_by_stage_and_reason": dict(sorted(dead_reasons.items())),
        "loss": loss,
        "duplicates": {"gateway_seen": gateway.get("duplicates"),
                       "stream_removed": stream.get("totals", {}).get("duplicate")},
        "alerts": detection,
        "latency_ms": {"gateway_delivery_p50": gateway.get("delivery_latency_ms_p50"),
                       "gateway_delivery_p99": gateway.get("delivery_latency_ms_p99"),
                       "raw_append_to_alert_p50": latencies[len(latencies) // 2] if latencies else None,
                       "raw_append_to_alert_p99": latencies[int(0.99 * (len(latencies) - 1))] if latencies else None},
        "components": results,
    }
    folder = options.out / "report"
    folder.mkdir(parents=True, exist_ok=True)
    plots = [report.plot_stage_rates(folder, live), *report.plot_devices(folder, archive, alerts, truth)]
    summary["report"] = {"folder": str(folder), "plots": [str(p) for p in plots if p]}
    report.write_summary(folder, summary)
    return summary


def print_summary(console: Console, summary: dict[str, Any]) -> None:
    messages, loss, alerts = summary["messages"], summary["loss"], summary["alerts"]
    stream = messages["stream"]
    console.print("\n[bold]iotwatch demo summary[/bold]" + ("" if summary["completed"] else
                                                          " [yellow](not fully drained)[/yellow]"))
    console.print(f"  messages: simulated {messages['simulated']}, gateway received {messages['gateway_received']}, "
                  f"forwarded {messages['gateway_forwarded']}, dead-lettered {messages['gateway_dead_lettered']}; "
                  f"stream scored {stream.get('reading_records')}, duplicates {stream.get('duplicate')}, "
                  f"late {stream.get('late')}, dead-lettered {stream.get('dlq')}")
    style = "green" if loss["loss"] == 0 else "bold red"
    console.print(f"  loss accounted by seq: [{style}]{loss['loss']}[/{style}] "
                  f"({loss['unique_readings_in_kafka']} unique readings in Kafka, {loss['archived']} archived, "
                  f"{loss['late']} late, {loss['declared_dropout_or_malformed_seqs']} seqs of injected dropouts or "
                  "malformed payloads)")
    console.print(f"  alerts vs ground truth: recall {alerts['recall']} ({alerts['anomalies_detected']}/"
                  f"{alerts['anomalies_injected']}), precision {alerts['precision']}, median delay "
                  f"{alerts['median_delay_readings']} readings, false alarms {alerts['false_alarms']}")
    for kind, stats in alerts["by_kind"].items():
        console.print(f"    {kind:<14} recall {stats['recall']:<6} ({stats['detected']}/{stats['injected']}) "
                      f"median delay {stats['median_delay_s']} s")
    latency = summary["latency_ms"]
    console.print(f"  latency: gateway delivery p50/p99 {latency['gateway_delivery_p50']}/"
                  f"{latency['gateway_delivery_p99']} ms; reading in Kafka to alert in Kafka p50/p99 "
                  f"{latency['raw_append_to_alert_p50']}/{latency['raw_append_to_alert_p99']} ms")
    console.print(f"  report: {summary['report']['folder']}")


def check_prerequisites() -> None:
    from iotwatch.spark import require_java

    require_java()
    if sys.version_info < (3, 11):
        raise IotwatchError("Python 3.11 or newer is needed")
