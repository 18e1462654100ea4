"""``iotwatch demo``: the whole product on the embedded stack, start to finish (docs/internals.md,
"Demo run")."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.live import Live

from iotwatch.application.demo import closed_loop, report
from iotwatch.application.demo.detection import judge_alerts
from iotwatch.application.demo.live import render
from iotwatch.application.demo.oncall_person import OnCallPerson
from iotwatch.application.demo.summary import (
    DemoSummary,
    Duplicates,
    KeptStack,
    Latency,
    Messages,
    OnCall,
    ReportFiles,
    SiteFigures,
)
from iotwatch.application.harness import accounting, pipeline
from iotwatch.application.harness.probe import LiveState, Probe
from iotwatch.application.harness.receiver import Receiver
from iotwatch.application.harness.results import write_summary
from iotwatch.application.stack import EmbeddedStack
from iotwatch.application.stack.embedded import StackState, remember_last_stack
from iotwatch.application.stack.mirror_maker import remote_topic
from iotwatch.application.stack.process import Component, free_port
from iotwatch.application.stack.replication import LagHistory, ReplicationLag, write_lag
from iotwatch.application.stack.sites import site_names
from iotwatch.clients.influx import InfluxV1Client, kept_client
from iotwatch.clients.kafka import batches_to_end, read_to_end
from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.detection import AnomalyKind
from iotwatch.contract.ground_truth import read_ground_truth
from iotwatch.contract.metric_catalog import PRIMARY_METRIC
from iotwatch.contract.oncall import CommandAudit, decode
from iotwatch.dashboards import build_all
from iotwatch.dashboards.queries import Picks, check_all
from iotwatch.dashboards.queries import summarise as summarise_checks
from iotwatch.errors import IotwatchError
from iotwatch.evaluation.judgement import TRUE
from iotwatch.gateway.metrics import wait_healthy
from iotwatch.settings import KafkaSettings, Settings
from iotwatch.stats import quantiles

log = logging.getLogger(__name__)

#: The demo gateway's client id: its instance tag in InfluxDB.
GATEWAY_ID = "demo-gateway"


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
    anomalies_after_s: float = 60.0
    keep_stack: bool = False
    #: edge sites (each its MQTT broker, Kafka node, gateway and simulators), replicated to
    #: the central cluster by MirrorMaker 2; 0: one cluster
    sites: int = 0
    #: Kafka's listeners (and MirrorMaker's links) over TLS, verified with the stack's private CA
    tls: bool = False


def run_demo(settings: Settings, options: DemoOptions, console: Console) -> DemoSummary:
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    sites = site_names(options.sites)
    tls = options.tls or settings.stack.tls
    stack_settings = settings.stack.model_copy(update={"sites": options.sites, "tls": tls})
    stack = EmbeddedStack(settings.model_copy(update={"stack": stack_settings}), out / "stack")
    children: list[Component] = []
    summary: DemoSummary | None = None
    receiver = Receiver()
    lag: ReplicationLag | None = None
    try:
        state = stack.up()
        settings = state.apply_to(settings)
        if state.services.get("influx") is None:
            console.print(
                "[yellow]InfluxDB is not installed: metrics go to the report only "
                "(apt-get install -y influxdb for dashboards)[/yellow]"
            )
        checkpoint, archive, truth_path = out / "checkpoint", out / "archive", out / "ground_truth.jsonl"
        gateway_port = free_port()
        # Event time runs `speedup` times faster than the wall clock: silence is judged in wall time.
        env = pipeline.component_env(state, out, silence_timeout_s=max(5.0, 30.0 / options.speedup))
        where = f"{len(sites)} sites" if sites else "the stack"
        console.print(f"stack up in {out / 'stack'} ({where}); starting the streaming job, gateways and simulators")

        def start(name: str, site: str | None, command: list[str], **extra: str) -> Component:
            """A component of the run, at ``site`` (its servers) or at the centre."""
            child = Component(
                _named(name, site), command, {**env, **(state.site_env(site) if site else {}), **extra}, out
            )
            children.append(child)
            return child

        stream = start("stream", None, pipeline.iotwatch_command("stream", "--json"))
        places: list[str | None] = [*sites] or [None]  # the sites, or the one cluster
        gateway_ports = {site: (gateway_port if site is None else free_port()) for site in places}
        for site, port in gateway_ports.items():
            start("gateway", site, pipeline.gateway_command(gateway_id(site), port))
        # The alert consumers start while Spark does: none of their start-up then competes with
        # the job's first micro-batch for the CPU.
        # The closed loop: the responder commands devices over the one MQTT broker, or with
        # sites writes the commands at the centre for each site's relay to deliver
        start("respond", None, pipeline.iotwatch_command("respond", "--json"))
        for site in sites:
            start("relay", site, pipeline.iotwatch_command("relay", "--json"))
        # on-call: notifications to a local receiver; the forwarder writes the on-call dashboard's measurements
        routes = str(receiver.write_routes(out / "routes.toml"))
        forward = pipeline.iotwatch_command("alerts", "forward", "--routes", routes, "--json")
        start("forward", None, forward, IOTWATCH_ALERTS_STATE_DIR=str(out / "forward"))
        for port in gateway_ports.values():
            wait_healthy(port, timeout_s=60)
        pipeline.wait_for_stream(stream, checkpoint)
        on_call = OnCallPerson(settings)
        simulators = [  # a new pipeline: every device from seq 0
            start(
                "simulate", site, _simulate_command(options, out, site, _site_truth(out, site) if site else truth_path)
            )
            for site in places
        ]
        live = LiveState()
        probe = Probe(
            settings,
            list(gateway_ports.values()),
            checkpoint,
            [remote_topic(site, settings.topics.raw) for site in sites] or None,
            [edge_kafka(settings, state, site) for site in sites],
        )
        lag = ReplicationLag(settings.kafka, sites) if sites else None
        lags = LagHistory(sites)

        def each_second() -> None:
            on_call.step()
            if lag is not None:
                _record_lag(settings, lag, lags)

        started = time.time()
        interrupted = False
        try:
            with Live(
                render(live, started, options.duration_s, "running"),
                console=console,
                refresh_per_second=2,
                transient=False,
            ) as view:
                while any(simulator.running() for simulator in simulators):
                    each_second()
                    probe.sample(live)
                    view.update(render(live, started, options.duration_s, "running"))
                    time.sleep(1.0)
                drained = _drain(probe, live, view, started, options, children, each_second)
        except KeyboardInterrupt:
            interrupted, drained = True, False
            console.print("[yellow]interrupted: stopping everything[/yellow]")
        finally:
            probe.close()
        results = {child.name: child.stop() for child in reversed(children)}
        if sites:
            _join_ground_truth([_site_truth(out, site) for site in sites], truth_path)
            results.update(_sum_site_results(results, sites))
        summary = _summarise(settings, options, results, live, drained, interrupted, checkpoint, archive, truth_path)
        if sites:
            summary.sites = sites_summary(settings, state, sites, lags, archive, truth_path, results)
        summary.oncall = OnCall(
            notifications_received=receiver.notifications, acknowledged_by_demo=len(on_call.acknowledged)
        )
        if options.keep_stack:
            summary.stack = kept_stack(state)
        write_summary(options.out / "report", summary)
        return summary
    finally:
        receiver.close()
        if lag is not None:
            lag.close()
        for child in children:
            child.stop(timeout_s=30)
        if not (options.keep_stack and stack_running(stack)):
            stack.down()
        else:
            remember_last_stack(stack.run_dir)  # `iotwatch stack status|down` find it
        if summary is None and options.keep_stack and stack_running(stack):
            console.print(f"[yellow]the stack is left running: iotwatch stack down --run-dir {stack.run_dir}[/yellow]")


def edge_kafka(settings: Settings, state: StackState, site: str) -> KafkaSettings:
    """Client settings for the site's own Kafka cluster."""
    return settings.kafka.model_copy(update={"bootstrap_servers": state.site_endpoints(site)["kafka"]})


def _site_truth(out: Path, site: str) -> Path:
    return out / f"ground_truth-{site}.jsonl"


def _named(name: str, site: str | None) -> str:
    return f"{name}-{site}" if site else name


def gateway_id(site: str | None) -> str:
    """The gateway's client id, its instance tag in InfluxDB: one gateway per site."""
    return f"{GATEWAY_ID}-{site}" if site else GATEWAY_ID


def _simulate_command(options: DemoOptions, out: Path, site: str | None, truth_path: Path) -> list[str]:
    """The simulator of the demo's fleet, or of one site's (ids prefixed with the site)."""
    prefix, suffix = (f"{site}-", f"-{site}") if site else ("", "")
    valued = {
        "--homes": options.homes,
        "--vehicles": options.vehicles,
        "--duration": options.duration_s * options.speedup,
        "--speedup": options.speedup,
        "--anomaly-rate": options.anomaly_rate,
        "--anomalies-after": options.anomalies_after_s if options.anomaly_rate > 0 else None,
        "--fault-rate": options.fault_rate,
        "--seed": options.seed,
        "--ground-truth": truth_path,
        "--client-id-prefix": f"iotwatch-demo-sim{suffix}",
        "--id-prefix": prefix or None,
        "--seq-state": out / f"simulate-seq{suffix}.json",
    }
    planned = planned_anomalies(options, out / f"scenario{suffix}.json", prefix)
    flags = ("--obey-commands", "--no-progress", "--json")
    return pipeline.iotwatch_command("simulate", *pipeline.option_args(valued), *planned, *flags)


def _record_lag(settings: Settings, lag: ReplicationLag, history: LagHistory) -> None:
    """One replication-lag sample per site: kept for the summary, written to InfluxDB."""
    lags = lag.sample()
    now_ms = int(time.time() * 1000)
    history.add(lags)
    if settings.influx.enabled:
        client = kept_client(settings.influx)
        try:
            write_lag(client, lags, now_ms)
        except IotwatchError as exc:
            log.warning("replication lag not written: %s", exc)


def _join_ground_truth(parts: list[Path], path: Path) -> None:
    """The sites' ground truth files as one (device ids carry their site)."""
    path.write_text("".join(part.read_text() for part in parts if part.exists()))


#: Summary counters that add up over the sites' gateways and simulators.
_ADDED = ("sent", "readings", "received", "forwarded", "dead_lettered", "duplicates")


def _sum_site_results(results: dict[str, Any], sites: list[str]) -> dict[str, Any]:
    """The sites' gateway and simulator summaries added up as the demo's ``gateway`` and
    ``simulate`` (each site's own stay under its name)."""
    summed: dict[str, Any] = {}
    for name in ("gateway", "simulate"):
        parts = [results.get(_named(name, site), {}) for site in sites]
        summed[name] = {key: sum(int(part.get(key) or 0) for part in parts) for key in _ADDED}
    return summed


def sites_summary(
    settings: Settings,
    state: StackState,
    sites: list[str],
    lags: LagHistory,
    archive: Path,
    truth_path: Path,
    results: dict[str, dict[str, Any]],
) -> dict[str, SiteFigures]:
    """Per site: readings at the site and at the centre, records MirrorMaker's at-least-once
    copying left twice at the centre, loss by seq (site -> centre -> archive), replication lag,
    the alerts raised for its devices and the commands they were sent (their outcomes at the
    centre, and what the site's relay published and carried back)."""
    truth = read_ground_truth(truth_path) if truth_path.exists() else []
    archived = accounting.archived_seqs(archive)
    late, _ = accounting.dead_letters(read_to_end(settings.kafka, settings.topics.dlq))
    alerts, _ = pipeline.decoded_alerts(read_to_end(settings.kafka, settings.topics.alerts))
    commands = closed_loop.latest_audits(
        decode(r.value(), CommandAudit) for r in read_to_end(settings.kafka, settings.topics.commands)
    ).values()
    result = {}
    for site in sites:
        at_site = accounting.index_raw([read_to_end(edge_kafka(settings, state, site), settings.topics.raw)])
        at_centre = accounting.index_raw([read_to_end(settings.kafka, remote_topic(site, settings.topics.raw))])
        centre_seqs = at_centre.seqs()
        not_replicated = sum(
            len(np.setdiff1d(seqs, centre_seqs.get(device, seqs[:0]), assume_unique=True))
            for device, seqs in at_site.seqs().items()
        )
        mine = [event for event in truth if event.device_id.startswith(f"{site}-")]
        archived_here = {device: seqs for device, seqs in archived.items() if device.startswith(f"{site}-")}
        loss = accounting.account(centre_seqs, archived_here, late, mine)
        raised = [a for a in alerts if a.raised and a.device_id.startswith(f"{site}-")]
        result[site] = SiteFigures(
            readings_at_site=at_site.readings,
            readings_at_centre=at_centre.readings,
            records_at_site=at_site.records,
            records_at_centre=at_centre.records,
            copied_twice_by_mirror_maker=at_centre.records - at_site.records,
            not_replicated=not_replicated,
            loss=loss.loss + not_replicated,
            archived=loss.archived,
            replication_lag=lags.summary(site),
            alerts_raised=len(raised),
            alerts_by_rule=dict(sorted(Counter(a.rule for a in raised).items())),
            commands=closed_loop.by_outcome(a for a in commands if a.device_id.startswith(f"{site}-")),
            relay={
                key: value
                for key, value in results.get(_named("relay", site), {}).items()
                if key in ("commands_published", "replies_forwarded", "twin_reports", "not_at_this_site")
            },
        )
    return result


def planned_anomalies(options: DemoOptions, path: Path, prefix: str = "") -> list[str]:
    """Simulator arguments for what the demo plans besides the random anomalies: a crash
    of the first vehicle at 40 % of the run (a random crash is rare in a short run, and the
    crash rule, the critical alerts and the vehicles dashboard's crash panels should show).
    It waits until the vehicle drives fast enough. An overheating engine in the second vehicle
    and a leak in the first homes that last the whole run unless the responder's ``limp_mode``
    and ``close_valve`` end them (the closed loop)."""
    span_s = options.duration_s * options.speedup
    at_s = max(options.anomalies_after_s, 0.4 * span_s)
    if at_s >= 0.8 * span_s:
        return []
    # Vehicle ids are vehicle-<5 digits>, home devices home-<5 digits>-<type>-<n> (devices/fleet.py).
    later = max(options.anomalies_after_s, 0.2 * span_s)
    planned: list[dict[str, object]] = []
    if options.vehicles:
        planned.append({"kind": "crash", "devices": f"{prefix}vehicle-00000", "at_s": at_s})
    if options.vehicles > 1:  # for the responder to put it in limp mode
        engine = f"{prefix}vehicle-00001"
        planned.append({"kind": "overheating", "devices": engine, "at_s": later, "duration_s": span_s})
    if options.homes:  # for the closed loop to close the valve
        leaks = f"{prefix}home-0000[0-2]-leak_sensor-*"
        planned.append({"kind": AnomalyKind.WATER_LEAK.value, "devices": leaks, "at_s": later, "duration_s": span_s})
    if not planned:
        return []
    path.write_text(json.dumps({"anomalies": planned}))
    return ["--scenario", str(path)]


def stack_running(stack: EmbeddedStack) -> bool:
    state = StackState.load(stack.run_dir)
    return state is not None and all(svc.process.is_running() for svc in state.services.values())


def kept_stack(state: StackState) -> KeptStack:
    """Where the stack left running is, and how to use and stop it."""
    return KeptStack(
        kept=True,
        run_dir=str(state.run_dir),
        endpoints=state.endpoints(),
        influx_database=state.database,
        env=state.env(),
        stop=f"iotwatch stack down --run-dir {state.run_dir}",
    )


def _drain(
    probe: Probe,
    live: LiveState,
    view: Live,
    started: float,
    options: DemoOptions,
    children: list[Component],
    each_second: Callable[[], None],
    timeout_s: float = 300.0,
) -> bool:
    """After the simulators end: wait until the gateway has nothing in flight and the job
    has processed everything in the raw topic (its newest committed batch reached the log end);
    ``each_second`` goes on meanwhile (the on-call person: the job's alerts come late)."""
    deadline = time.monotonic() + timeout_s
    catch_up = pipeline.CatchUp()
    while time.monotonic() < deadline:
        each_second()
        sample = probe.sample(live)
        view.update(render(live, started, options.duration_s, "draining"))
        if not all(child.running() for child in children if not child.name.startswith("simulate")):
            return False
        if catch_up.update(sample):
            return True
        time.sleep(1.0)
    return False


def _summarise(
    settings: Settings,
    options: DemoOptions,
    results: dict[str, dict[str, Any]],
    live: LiveState,
    drained: bool,
    interrupted: bool,
    checkpoint: Path,
    archive: Path,
    truth_path: Path,
) -> DemoSummary:
    truth = read_ground_truth(truth_path) if truth_path.exists() else []
    dead_letter_topics = [settings.topics.dlq] + [
        remote_topic(site, settings.topics.dlq) for site in site_names(options.sites)
    ]
    late, dead_reasons = accounting.dead_letters(
        record for topic in dead_letter_topics for record in read_to_end(settings.kafka, topic)
    )
    raw = accounting.index_raw(
        batch
        for topic in _raw_topics(settings, options)
        for batch in batches_to_end(settings.kafka, topic, accounting.RAW_READ_TIMEOUT_S)
    )
    alert_records = read_to_end(settings.kafka, settings.topics.alerts)
    alerts, alert_records = pipeline.decoded_alerts(alert_records)
    # Latency of the pipeline after the gateway: the triggering reading's append to the raw
    # topic -> the alert's append to the alert topic (wall clock; event time may be accelerated).
    # device_silent is raised a silence timeout after the device's last reading, by design.
    appended = [
        (r.timestamp()[1], raw.appended_at(a.device_id, a.seq))
        for r, a in zip(alert_records, alerts, strict=True)
        if a.raised and a.rule != "device_silent" and a.seq is not None
    ]
    alert_latency = quantiles(
        sorted(alerted - reading for alerted, reading in appended if reading is not None), (0.5, 0.99), digits=1
    )
    loss = accounting.account(raw.seqs(), accounting.archived_seqs(archive), late, truth)
    detection, verdicts = judge_alerts(alerts, truth, raw, options.speedup)
    simulator, gateway, stream = results.get("simulate", {}), results.get("gateway", {}), results.get("stream", {})
    audits = [decode(r.value(), CommandAudit) for r in read_to_end(settings.kafka, settings.topics.commands)]
    totals = stream.get("totals", {})
    folder = options.out / "report"
    folder.mkdir(parents=True, exist_ok=True)
    report.write_alerts(folder, alerts, verdicts)
    plots = [
        report.plot_stage_rates(folder, live),
        report.plot_closed_loop(folder, closed_loop.timings(audits, alerts)[1]),
        *report.plot_devices(folder, archive, alerts, truth, verdicts),
    ]
    summary = DemoSummary(
        options={k: str(v) for k, v in options.__dict__.items()},
        completed=drained and not interrupted,
        messages=Messages(
            simulated=simulator.get("sent"),
            simulated_readings=simulator.get("readings"),
            gateway_received=gateway.get("received"),
            gateway_forwarded=gateway.get("forwarded"),
            gateway_dead_lettered=gateway.get("dead_lettered"),
            kafka_raw_unique_readings=loss.unique_readings_in_kafka,
            kafka_raw_unparseable=raw.unparseable,
            stream=totals,
        ),
        dead_letters_by_stage_and_reason=dict(sorted(dead_reasons.items())),
        loss=loss,
        duplicates=Duplicates(gateway_seen=gateway.get("duplicates"), stream_removed=totals.get("duplicate")),
        alerts=detection,
        latency_ms=Latency(
            gateway_delivery_p50=gateway.get("delivery_latency_ms_p50"),
            gateway_delivery_p99=gateway.get("delivery_latency_ms_p99"),
            raw_append_to_alert_p50=alert_latency["p50"],
            raw_append_to_alert_p99=alert_latency["p99"],
        ),
        closed_loop=closed_loop.summarise(audits, alerts, truth),
        dashboards=check_dashboards(
            settings,
            alerts,
            verdicts,
            raw.identities,
            frozenset(a.device_id for a in audits),
            gateway_id(next(iter(site_names(options.sites)), None)),
        ),
        components=results,
        report=ReportFiles(folder=str(folder), plots=[str(p) for p in plots if p]),
    )
    write_summary(folder, summary)
    return summary


def _raw_topics(settings: Settings, options: DemoOptions) -> list[str]:
    """Where the job's input is at the centre: the raw topic, or each site's replica of it."""
    sites = site_names(options.sites)
    return [remote_topic(site, settings.topics.raw) for site in sites] or [settings.topics.raw]


def pick_values(
    alerts: list[AlertRecord],
    verdicts: dict[str, str],
    identities: dict[str, tuple[str, str]],
    commanded: frozenset[str] = frozenset(),
    instance: str = GATEWAY_ID,
) -> Picks | None:
    """Dashboard variables as an operator would set them after this run: the site of a home
    device that raised an alert (one that was sent a command if any, so the device
    dashboard's command annotations have something to show; then one matching an injected
    anomaly), that device and the alert's metric; every site and every vehicle where a
    picker takes several (they open on All); the demo gateway."""
    homes = sorted(d for d, (kind, _) in identities.items() if kind in PRIMARY_METRIC and kind != "vehicle_edr")
    if not homes:
        return None
    raised = sorted(
        (a for a in alerts if a.raised and a.device_id in homes and a.rule != "device_silent"),
        key=lambda a: (
            a.device_id not in commanded,
            verdicts.get(a.alert_id) != TRUE,
            a.metric is None,
        ),
    )
    device, metric = (raised[0].device_id, raised[0].metric) if raised else (homes[0], None)
    device_type, site = identities[device]
    vehicles = sorted(d for d, (kind, _) in identities.items() if kind == "vehicle_edr")
    return Picks(
        site=site,
        device=device,
        metric=metric or PRIMARY_METRIC[device_type],
        instance=instance,
        vehicles=vehicles,
        sites=sorted({where for _, where in identities.values()}),
    )


def check_dashboards(
    settings: Settings,
    alerts: list[AlertRecord],
    verdicts: dict[str, str],
    identities: dict[str, tuple[str, str]],
    commanded: frozenset[str] = frozenset(),
    instance: str = GATEWAY_ID,
) -> dict[str, Any] | None:
    """Run every dashboard query (panels, variables, annotations) against the run's InfluxDB,
    with the variables set from the run; None when the stack runs without InfluxDB."""
    if not settings.influx.enabled:
        return None
    picks = pick_values(alerts, verdicts, identities, commanded, instance)
    if picks is None:
        return {"error": "no home device in the raw topic to set the dashboard variables with"}
    client = InfluxV1Client(settings.influx)
    try:
        return summarise_checks(check_all(build_all().values(), picks, client.query), picks)
    finally:
        client.close()


def check_prerequisites() -> None:
    from iotwatch.jvm.spark import require_java

    require_java()
