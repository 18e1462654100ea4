"""The demo's results: its summary (``iotwatch demo --json``, ``report/summary.json``) as typed
records, and the summary printed for a person (docs/internals.md, "Demo summary")."""

from __future__ import annotations

from typing import Any

import msgspec
from rich.console import Console

from iotwatch.application.demo.closed_loop import ClosedLoop, CommandCounts
from iotwatch.application.demo.detection import Detection
from iotwatch.application.demo.oncall_person import ON_CALL
from iotwatch.application.harness.accounting import Loss


class Messages(msgspec.Struct, kw_only=True):
    """Messages per stage: the simulators', the gateway's and the job's own counts (None when
    a component gave no summary), and the raw topic's."""

    simulated: int | None
    simulated_readings: int | None
    gateway_received: int | None
    gateway_forwarded: int | None
    gateway_dead_lettered: int | None
    kafka_raw_unique_readings: int
    kafka_raw_unparseable: int
    #: the job's totals by kind of record (``reading_records``, ``duplicate``, ``late``, ``dlq``, ...)
    stream: dict[str, int]


class Duplicates(msgspec.Struct, kw_only=True):
    gateway_seen: int | None
    stream_removed: int | None


class Latency(msgspec.Struct, kw_only=True):
    """Milliseconds: the gateway's MQTT -> Kafka delivery, and a reading's append to the raw
    topic -> its alert's append to the alert topic (wall clock)."""

    gateway_delivery_p50: float | None
    gateway_delivery_p99: float | None
    raw_append_to_alert_p50: float | None
    raw_append_to_alert_p99: float | None


class OnCall(msgspec.Struct, kw_only=True):
    notifications_received: int
    acknowledged_by_demo: int


class ReportFiles(msgspec.Struct, kw_only=True):
    folder: str
    plots: list[str]


class SiteFigures(msgspec.Struct, kw_only=True):
    """One site's readings at the site and at the centre, loss by seq from the site to the
    archive, replication lag, alerts and commands."""

    readings_at_site: int
    readings_at_centre: int
    records_at_site: int
    records_at_centre: int
    #: MirrorMaker's at-least-once copies (the site's own duplicates, e.g. a device
    #: publishing twice, are in both counts)
    copied_twice_by_mirror_maker: int
    not_replicated: int
    loss: int
    archived: int
    #: p50, p99 and max of the samples, ms
    replication_lag: dict[str, float | int | None]
    alerts_raised: int
    alerts_by_rule: dict[str, int]
    commands: CommandCounts
    #: what the site's relay published and carried back
    relay: dict[str, Any]


class KeptStack(msgspec.Struct, kw_only=True):
    """Where the stack left running answers, and how to use and stop it."""

    kept: bool
    run_dir: str
    endpoints: dict[str, str | None]
    influx_database: str | None
    env: dict[str, str]
    stop: str


class DemoSummary(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a demo run did, stage by stage (``iotwatch demo --json``)."""

    options: dict[str, str]
    #: drained and not interrupted: every stage processed everything
    completed: bool
    messages: Messages
    dead_letters_by_stage_and_reason: dict[str, int]
    loss: Loss
    duplicates: Duplicates
    alerts: Detection
    latency_ms: Latency
    closed_loop: ClosedLoop
    #: every dashboard query run against the run's InfluxDB (None without InfluxDB)
    dashboards: dict[str, Any] | None
    #: each component's own ``--json`` summary, by name
    components: dict[str, dict[str, Any]]
    report: ReportFiles
    sites: dict[str, SiteFigures] | None = None
    oncall: OnCall | None = None
    stack: KeptStack | None = None

    @property
    def lost(self) -> bool:
        """Whether any reading was lost, at the centre or at a site."""
        return bool(self.loss.loss or any(site.loss for site in (self.sites or {}).values()))


def print_summary(console: Console, summary: DemoSummary) -> None:
    messages, loss, alerts = summary.messages, summary.loss, summary.alerts
    stream = messages.stream
    console.print(
        "\n[bold]iotwatch demo summary[/bold]" + ("" if summary.completed else " [yellow](not fully drained)[/yellow]")
    )
    console.print(
        f"  messages: simulated {messages.simulated}, gateway received {messages.gateway_received}, "
        f"forwarded {messages.gateway_forwarded}, dead-lettered {messages.gateway_dead_lettered}; "
        f"stream scored {stream.get('reading_records')}, duplicates {stream.get('duplicate')}, "
        f"late {stream.get('late')}, clock steps {stream.get('clock_steps', 0)}, dead-lettered {stream.get('dlq')}"
    )
    style = "green" if loss.loss == 0 else "bold red"
    console.print(
        f"  loss accounted by seq: [{style}]{loss.loss}[/{style}] "
        f"({loss.unique_readings_in_kafka} unique readings in Kafka, {loss.archived} archived, "
        f"{loss.late} late, {loss.declared_dropout_or_malformed_seqs} seqs of injected dropouts or "
        "malformed payloads)"
    )
    by_rule = ", ".join(f"{rule} {n}" for rule, n in alerts.false_alarms_by_rule.items())
    console.print(
        f"  alerts vs ground truth (anomalies injected after {float(summary.options['anomalies_after_s']):g} s of "
        f"event time): recall {alerts.recall} ({alerts.anomalies_detected}/"
        f"{alerts.anomalies_injected}), precision {alerts.precision} "
        f"({alerts.alerts_detecting_an_anomaly} detecting and {alerts.false_alarms} false of "
        f"{alerts.alerts_raised} raised alerts; {alerts.alerts_related_to_an_anomaly} related to an "
        f"anomaly and {alerts.end_of_run_silences} device_silent at the end of the run not counted), "
        f"median delay {alerts.median_delay_readings} readings, false alarms {alerts.false_alarms}"
        + (f" ({by_rule})" if by_rule else "")
    )
    for kind, stats in alerts.by_kind.items():
        delay = f"{stats.median_delay_s} s" if stats.median_delay_s is not None else "n/a"
        if kind == "dropout" and stats.median_delay_s is None:
            delay = "n/a (silence is judged in wall time)"
        console.print(
            f"    {kind:<14} recall {stats.recall!s:<6} ({stats.detected}/{stats.injected}) median delay {delay}"
        )
    latency = summary.latency_ms
    console.print(
        f"  latency: gateway delivery p50/p99 {latency.gateway_delivery_p50}/"
        f"{latency.gateway_delivery_p99} ms; reading in Kafka to alert in Kafka p50/p99 "
        f"{latency.raw_append_to_alert_p50}/{latency.raw_append_to_alert_p99} ms"
    )
    loop = summary.closed_loop
    console.print(
        f"  closed loop: {loop.commands} commands {loop.outcomes}, "
        f"{loop.anomalies_ended_by_command} anomalies ended by a command; p50/p99 alert to command "
        f"{loop.time_to_command_s}, command to device ack {loop.time_to_device_ack_s}, "
        f"command to alert cleared {loop.time_to_recovery_s}"
    )
    if summary.oncall:
        console.print(
            f"  on-call: {summary.oncall.notifications_received} notifications to the demo receiver, "
            f"{summary.oncall.acknowledged_by_demo} alerts acknowledged by {ON_CALL}"
        )
    for site, figures in (summary.sites or {}).items():
        style = "green" if figures.loss == 0 else "bold red"
        lag, commands = figures.replication_lag, figures.commands
        console.print(
            f"  site {site}: {figures.readings_at_site} readings at the site, {figures.readings_at_centre} "
            f"at the centre ({figures.copied_twice_by_mirror_maker} copied twice), loss [{style}]{figures.loss}"
            f"[/{style}]; replication lag p50/p99/max {lag['p50_ms']}/{lag['p99_ms']}/{lag['max_ms']} ms; "
            f"{figures.alerts_raised} alerts raised; commands {commands.sent} sent, "
            f"{commands.acknowledged} acknowledged by the device, {commands.expired} "
            f"expired unanswered, {commands.open} open"
        )
    print_dashboards(console, summary.dashboards)
    console.print(f"  report: {summary.report.folder}")
    if summary.stack:
        print_kept_stack(console, summary.stack)


def print_dashboards(console: Console, result: dict[str, Any] | None) -> None:
    if result is None:
        console.print("  dashboards: not checked (no InfluxDB in the stack)")
    elif "error" in result:
        console.print(f"  dashboards: not checked ({result['error']})")
    else:
        complete = result["queries_with_data"] == result["queries_checked"]
        style = "green" if complete else "yellow"
        console.print(
            f"  dashboards: [{style}]{result['queries_with_data']}/{result['queries_checked']}[/{style}] "
            f"queries return data ({result['dashboards']} dashboards: panels, variables, annotations; "
            f"site {result['values']['site']}, device {result['values']['device']})"
            + ("" if complete else "; no data: " + ", ".join(result["empty"] + list(result["errors"])))
        )


def print_kept_stack(console: Console, stack: KeptStack) -> None:
    """Where the stack left running answers, and how to stop it."""
    console.print(f"  stack left running ({stack.run_dir}):")
    for role, endpoint in stack.endpoints.items():
        if endpoint:
            console.print(f"    {role:<7}{endpoint}")
    if stack.endpoints.get("influx"):
        console.print(
            f"    Grafana: iotwatch dashboards push --url http://GRAFANA:3000 --influx-url "
            f"{stack.endpoints['influx']} --database {stack.influx_database}"
        )
    console.print("    other shells: " + " ".join(f"export {k}={v};" for k, v in stack.env.items()))
    console.print(f"    stop it with: {stack.stop}")
