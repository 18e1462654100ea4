"""``iotwatch chaos``: the whole pipeline under steady load while the fault schedule kills,
interrupts and pauses every component in turn; then the proofs from the data
(docs/operate/chaos.md says what runs, when a fault has recovered and what each proof reads).

The job judges silence after an hour (:data:`SILENCE_TIMEOUT_S`): an outage distorts wall time,
and live and replayed alerts must answer the same readings.
"""

from __future__ import annotations

import json
import logging
import resource
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import psutil
from rich.console import Console

from iotwatch.application.chaos import proofs, report
from iotwatch.application.chaos.faults import FaultRunner, Recovery, Targets
from iotwatch.application.chaos.resources import Limits, Sampler, judge, quiet_windows, slope_per_minute
from iotwatch.application.chaos.schedule import Action, ScheduleOptions, plan
from iotwatch.application.chaos.summary import ChaosMessages, ChaosSummary, Resources
from iotwatch.application.harness import accounting, pipeline
from iotwatch.application.harness.probe import LiveState, Probe
from iotwatch.application.harness.receiver import Receiver
from iotwatch.application.harness.results import write_summary
from iotwatch.application.stack import EmbeddedStack
from iotwatch.application.stack.process import Component, free_port
from iotwatch.clients.kafka import batches_to_end, read_to_end
from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.ground_truth import read_ground_truth
from iotwatch.contract.oncall import CommandAudit, decode
from iotwatch.errors import IotwatchError
from iotwatch.gateway.metrics import wait_healthy
from iotwatch.settings import Settings
from iotwatch.streaming.replay_cli import alert_ids

log = logging.getLogger(__name__)

GATEWAY_ID = "chaos-gateway"
REPLAY_TAG = "chaos"
#: The job's silence timeout in a chaos run (see the module's docstring).
SILENCE_TIMEOUT_S = 3600.0
#: The responder's timeouts in a chaos run: commands left open when the devices stop expire
#: within the drain.
COMMAND_TTL_S, REPLY_TIMEOUT_S = 30.0, 15.0


@dataclass(frozen=True)
class ChaosOptions:
    out: Path
    schedule: ScheduleOptions
    rate: float = 2000.0  # messages a second from the simulators
    homes: int = 40
    vehicles: int = 2
    anomaly_rate: float = 6.0
    warm_up_s: float = 120.0  # resources: growth is judged after this long in each process
    min_span_s: float = 120.0  # ... over at least this long after warm-up
    limits: Limits = field(default_factory=Limits)
    sample_every_s: float = 5.0
    recovery_timeout_s: float = 300.0
    drain_timeout_s: float = 300.0
    replay_timeout_s: float = 1800.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "homes": self.homes,
            "vehicles": self.vehicles,
            "anomaly_rate": self.anomaly_rate,
            "warm_up_s": self.warm_up_s,
            "min_span_s": self.min_span_s,
            "limits_per_min": self.limits.__dict__,
            "schedule": self.schedule.to_dict(),
            "out": str(self.out),
        }


@dataclass
class Timeline:
    """What the run saw once a second (the report's plots)."""

    live: LiveState = field(default_factory=LiveState)
    unplanned_exits: list[dict[str, Any]] = field(default_factory=list)
    load_s: float = 0.0  # how long the load ran


def run_chaos(settings: Settings, options: ChaosOptions, console: Console) -> ChaosSummary:
    """One chaos run in ``options.out`` (see the module's docstring); returns the summary.
    Everything it started is stopped, on Ctrl-C or an error too."""
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    # a server restarted after kill -9 recovers its logs first: give it the recovery's time
    timeout = max(settings.stack.startup_timeout_s, options.recovery_timeout_s)
    settings = settings.model_copy(update={"stack": settings.stack.model_copy(update={"startup_timeout_s": timeout})})
    stack = EmbeddedStack(settings, out / "stack")
    receiver = Receiver()
    components: dict[str, Component] = {}  # the fault schedule's targets
    others: list[Component] = []  # the simulators, the replay
    try:
        state = stack.up()
        settings = state.apply_to(settings)
        env = pipeline.component_env(state, out, silence_timeout_s=SILENCE_TIMEOUT_S)
        env.update(
            IOTWATCH_RESPOND_COMMAND_TTL_S=str(COMMAND_TTL_S),
            IOTWATCH_RESPOND_REPLY_TIMEOUT_S=str(REPLY_TIMEOUT_S),
            IOTWATCH_ALERTS_STATE_DIR=str(out / "forward"),
        )
        gateway_port = free_port()
        console.print(f"stack up in {out / 'stack'}; starting the pipeline")
        components["stream"] = Component("stream", pipeline.iotwatch_command("stream", "--json"), env, out)
        components["gateway"] = Component("gateway", pipeline.gateway_command(GATEWAY_ID, gateway_port), env, out)
        wait_healthy(gateway_port, timeout_s=60)
        pipeline.wait_for_stream(components["stream"], out / "checkpoint")
        components["respond"] = Component("respond", pipeline.iotwatch_command("respond", "--json"), env, out)
        components["forward"] = Component(
            "forward", pipeline.iotwatch_command("alerts", "forward", "--webhook", receiver.url, "--json"), env, out
        )
        truth_path = out / "ground_truth.jsonl"
        simulator = Component("simulate", _simulate_command(options, out, truth_path), env, out)
        others.append(simulator)
        probe = Probe(settings, [gateway_port], out / "checkpoint")
        _await_first_batch(probe, simulator, options.recovery_timeout_s)
        started = time.time()
        faults = plan(options.schedule)
        (out / "schedule.json").write_text(json.dumps([f.to_dict() for f in faults], indent=2))
        console.print(
            f"load on: {options.rate:g} msg/s; {len(faults)} faults planned over {options.schedule.duration_s:g} s"
        )
        targets = Targets(stack, state, components)
        runner = FaultRunner(
            faults,
            targets,
            Recovery(settings, gateway_port, Probe(settings, [gateway_port], out / "checkpoint")),
            started,
            options.recovery_timeout_s,
        )
        runner_itself = psutil.Process()  # its own memory is judged as the components' is
        sampler = Sampler(
            lambda: {**targets.trees(), **_tree_of(simulator), "chaos": (runner_itself.pid, [runner_itself])},
            started,
            data_dir=out / "stack",
        )
        timeline = Timeline()
        runner.start()
        try:
            _watch(options, runner, targets, sampler, probe, timeline, simulator, console)
            simulator.stop(timeout_s=60)
            timeline.load_s = runner.now()
            drained = _drain(settings, options, probe, timeline, receiver, console)
        finally:
            runner.stop.set()
            runner.recovery.close()
            probe.close()
        results = {name: components[name].stop() for name in ("respond", "forward", "gateway", "stream")}
        results["simulate"] = simulator.result()
        console.print("pipeline stopped; replaying the raw topic without faults (Kappa)")
        replay = Component("replay", pipeline.iotwatch_command("replay", "--tag", REPLAY_TAG, "--json"), env, out)
        others.append(replay)
        try:
            replay.process.wait(options.replay_timeout_s)
        except subprocess.TimeoutExpired:
            console.print(f"[red]the replay did not finish within {options.replay_timeout_s:.0f} s[/red]")
        results["replay"] = replay.stop(timeout_s=30)
        summary, raw = _prove(settings, options, runner, sampler, timeline, receiver, components, results, drained)
        summary.report = report.write(
            out / "report", timeline.live, sampler, runner.records, started, raw, summary.loss.loss
        )
        write_summary(out / "report", summary)
        return summary
    finally:
        receiver.close()
        for component in [*others, *components.values()]:  # on Ctrl-C or an error too
            component.stop(timeout_s=30)
        stack.down()


def _simulate_command(options: ChaosOptions, out: Path, truth_path: Path) -> list[str]:
    """The simulators: until stopped, ``rate`` messages a second, anomalies, commands obeyed."""
    valued = {
        "--homes": options.homes,
        "--vehicles": options.vehicles,
        "--target-rate": options.rate,
        "--anomaly-rate": options.anomaly_rate,
        "--anomalies-after": 20,
        "--seed": options.schedule.seed,
        "--ground-truth": truth_path,
        "--client-id-prefix": "iotwatch-chaos-sim",
        "--seq-state": out / "simulate-seq.json",
    }
    flags = ("--obey-commands", "--no-progress", "--json")
    return pipeline.iotwatch_command("simulate", *pipeline.option_args(valued), *flags)


def _await_first_batch(probe: Probe, simulator: Component, timeout_s: float) -> None:
    """Until the job has committed its first micro-batch of the load: the schedule's time
    (and the lead before the first fault) counts from a pipeline that flows."""
    deadline = time.monotonic() + timeout_s
    while probe.stream_offset() == 0:
        if not simulator.running() or time.monotonic() > deadline:
            raise IotwatchError(f"no micro-batch committed within {timeout_s:.0f} s of load: see the run folder's logs")
        time.sleep(1.0)


def _tree_of(component: Component) -> dict[str, Any]:
    tree = component.tree() if component.running() else []
    return {component.name: (component.pid, tree)} if tree else {}


def _watch(
    options: ChaosOptions,
    runner: FaultRunner,
    targets: Targets,
    sampler: Sampler,
    probe: Probe,
    timeline: Timeline,
    simulator: Component,
    console: Console,
) -> None:
    """Until the duration has passed and the last fault recovered: sample once a second,
    resources every ``sample_every_s``, and start again what ended without a fault."""
    next_resources = 0.0
    reported = 0
    while not (runner.finished.is_set() and runner.now() >= options.schedule.duration_s):
        probe.sample(timeline.live)
        if runner.now() >= next_resources:
            sampler.sample(options.out / "checkpoint" / "state")
            next_resources = runner.now() + options.sample_every_s
        for name in targets.names():
            if name != runner.busy and not targets.running(name):
                with targets.lock:
                    if name == runner.busy or targets.running(name):
                        continue
                timeline.unplanned_exits.append({"target": name, "at_s": round(runner.now(), 1)})
                console.print(f"[red]{name} ended without a fault at {runner.now():.0f} s: starting it again[/red]")
                targets.start_again(name)
        if not simulator.running():
            timeline.unplanned_exits.append({"target": "simulate", "at_s": round(runner.now(), 1)})
            simulator.restart()
        while reported < len(runner.records):
            console.print(f"{runner.now():6.0f} s  fault: {runner.records[reported].planned.kind.name}")
            reported += 1
        time.sleep(1.0)


def _drain(
    settings: Settings,
    options: ChaosOptions,
    probe: Probe,
    timeline: Timeline,
    receiver: Receiver,
    console: Console,
) -> dict[str, bool]:
    """After the load stopped: until the job has processed the whole raw topic, every
    command's audit is final and every alert record was notified (or the timeout)."""
    console.print("load stopped; draining")
    deadline = time.monotonic() + options.drain_timeout_s
    done = {"stream": False, "commands": False, "notifications": False}
    catch_up = pipeline.CatchUp()
    while time.monotonic() < deadline and not all(done.values()):
        done["stream"] = catch_up.update(probe.sample(timeline.live))
        if done["stream"]:
            audits = [decode(r.value(), CommandAudit) for r in read_to_end(settings.kafka, settings.topics.commands)]
            done["commands"] = proofs.commands(audits).ok
            alerts = all_alerts(settings)
            done["notifications"] = proofs.notifications(alerts, receiver.keys).ok
        time.sleep(2.0)
    return done


def all_alerts(settings: Settings) -> list[AlertRecord]:
    """Every alert record on the alert topic (raised and cleared)."""
    return pipeline.decoded_alerts(read_to_end(settings.kafka, settings.topics.alerts))[0]


def _prove(
    settings: Settings,
    options: ChaosOptions,
    runner: FaultRunner,
    sampler: Sampler,
    timeline: Timeline,
    receiver: Receiver,
    components: dict[str, Component],
    results: dict[str, dict[str, Any]],
    drained: dict[str, bool],
) -> tuple[ChaosSummary, accounting.RawIndex]:
    """The summary: each proof's verdict and figures, resources, faults; and the raw topic's index."""
    out = options.out
    truth_path = out / "ground_truth.jsonl"
    truth = read_ground_truth(truth_path) if truth_path.exists() else []
    late, dead_reasons = accounting.dead_letters(read_to_end(settings.kafka, settings.topics.dlq))
    # an hour's raw topic is millions of records: indexed a batch at a time, never held
    raw = accounting.index_raw(batches_to_end(settings.kafka, settings.topics.raw, accounting.RAW_READ_TIMEOUT_S))
    loss = accounting.account(raw.seqs(), accounting.archived_seqs(out / "archive"), late, truth)
    stream = results.get("stream", {}).get("totals", {})
    loss_proof = proofs.LossProof(
        **msgspec.structs.asdict(loss),
        ok=loss.loss == 0 and loss.unique_readings_in_kafka > 0,
        duplicates={
            "raw_topic_copies_beyond_first": raw.records - raw.unparseable - raw.readings,
            "gateway_seen": results.get("gateway", {}).get("duplicates"),
            "removed_by_stream_last_start": stream.get("duplicate"),
        },
        dead_letters_by_stage_and_reason=dict(sorted(dead_reasons.items())),
    )
    alerts = all_alerts(settings)
    replay_topic = f"{settings.topics.alerts}.{REPLAY_TAG}"
    alert_proof = proofs.alerts_match(
        alert_ids(settings.kafka, settings.topics.alerts), alert_ids(settings.kafka, replay_topic)
    )
    audits = [decode(r.value(), CommandAudit) for r in read_to_end(settings.kafka, settings.topics.commands)]
    faults = [r.to_dict() for r in runner.records]
    # started again after a kill or a Ctrl-C of the schedule (a pause is not a restart)
    restarted = {kind.target: 0 for kind in options.schedule.kinds if kind.action is not Action.PAUSE}
    for record in runner.records:
        if record.planned.kind.action is not Action.PAUSE and record.restored_s is not None:
            restarted[record.planned.kind.target] += 1
    # growth is judged while nothing is disturbed: from each fault's recovery to the next fault
    windows = quiet_windows(
        [(r.injected_s, r.recovered_s or timeline.load_s) for r in runner.records if r.injected_s is not None],
        timeline.load_s,
    )
    resources = judge(sampler.samples, options.limits, options.warm_up_s, options.min_span_s, windows)
    state_store = [(t, 0, float(b)) for t, b in sampler.state_store]
    state_slope = slope_per_minute(state_store, options.warm_up_s, options.min_span_s, windows).per_min
    lag_series = [(x.t - runner.started, max(0, x.raw_end - x.stream_offset)) for x in timeline.live.samples]
    verdicts: list[proofs.Proof | proofs.LossProof] = [
        loss_proof,
        alert_proof,
        notified := proofs.notifications(alerts, receiver.keys),
        commanded := proofs.commands(audits),
        recovered := proofs.recovery(faults, restarted),
        lag := proofs.catch_up(faults, lag_series, timeline.load_s, options.rate),
    ]
    usage = Resources(
        ok=all(entry["within_limits"] is not False for entry in resources.values()),
        judged=[name for name, entry in resources.items() if entry["within_limits"] is not None],
        quiet_windows=len(windows),
        quiet_s=round(sum(high - low for low, high in windows), 1),
        processes=resources,
        chaos_peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        state_store_bytes={
            "last": sampler.state_store[-1][1] if sampler.state_store else None,
            "slope_per_min": None if state_slope is None else round(state_slope, 1),
        },
    )
    summary = ChaosSummary(
        ok=all(v.ok for v in verdicts) and usage.ok and not timeline.unplanned_exits and all(drained.values()),
        options={**options.to_dict(), "kafka_nodes": len(settings.kafka.bootstrap_servers.split(","))},
        load_s=round(timeline.load_s, 1),
        run_s=round(runner.now(), 1),
        loss=loss_proof,
        alerts=alert_proof,
        notifications=notified,
        commands=commanded,
        recovery=recovered,
        lag=lag,
        resources=usage,
        faults=faults,
        unplanned_exits=timeline.unplanned_exits,
        drained=drained,
        messages=ChaosMessages(
            simulated=results.get("simulate", {}).get("sent"),
            simulated_readings=results.get("simulate", {}).get("readings"),
            raw_topic_records=raw.records,
            alerts_records=len(alerts),
        ),
        components=results,
    )
    return summary, raw
