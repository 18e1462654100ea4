"""The chaos run's results: its summary (``iotwatch chaos --json``, ``report/summary.json``)
as typed records, and the summary printed for a person. The proofs' records are in
:mod:`iotwatch.application.chaos.proofs`; :mod:`iotwatch.application.harness.results` makes the JSON.
"""

from __future__ import annotations

from typing import Any

import msgspec
from rich.console import Console

from iotwatch.application.chaos.proofs import (
    AlertsProof,
    CatchUpProof,
    CommandsProof,
    LossProof,
    NotificationsProof,
    RecoveryProof,
)


class Resources(msgspec.Struct, kw_only=True):
    """Growth of each process's memory, file descriptors and threads while nothing is
    disturbed (:func:`iotwatch.application.chaos.resources.judge`), and the state store's."""

    ok: bool
    judged: list[str]
    quiet_windows: int
    quiet_s: float
    processes: dict[str, dict[str, Any]]
    #: the proofs read the whole raw topic and archive after the load: their peak
    chaos_peak_rss_bytes: int
    state_store_bytes: dict[str, float | None]


class ChaosMessages(msgspec.Struct, kw_only=True):
    simulated: int | None
    simulated_readings: int | None
    raw_topic_records: int
    alerts_records: int


class ChaosReport(msgspec.Struct, kw_only=True):
    folder: str
    plots: list[str]
    resources_csv: str
    pipeline_csv: str


class ChaosSummary(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a chaos run proved (``ok``: every proof, the resources, no unplanned exit, drained)."""

    ok: bool
    options: dict[str, Any]
    load_s: float
    #: the load, the drain and the replay
    run_s: float
    loss: LossProof
    alerts: AlertsProof
    notifications: NotificationsProof
    commands: CommandsProof
    recovery: RecoveryProof
    lag: CatchUpProof
    resources: Resources
    #: each fault's record (:meth:`iotwatch.application.chaos.faults.FaultRecord.to_dict`)
    faults: list[dict[str, Any]]
    unplanned_exits: list[dict[str, Any]]
    drained: dict[str, bool]
    messages: ChaosMessages
    #: each component's own ``--json`` summary, by name
    components: dict[str, dict[str, Any]]
    report: ChaosReport | None = None


def print_summary(console: Console, summary: ChaosSummary) -> None:
    def verdict(ok: bool | None) -> str:
        return "[green]ok[/green]" if ok else "[bold red]FAILED[/bold red]"

    loss, alerts, notes, commands = summary.loss, summary.alerts, summary.notifications, summary.commands
    console.print(f"\n[bold]iotwatch chaos[/bold]: {verdict(summary.ok)} after {summary.load_s} s of load")
    console.print(
        f"  loss by seq {verdict(loss.ok)}: {loss.loss} lost of {loss.unique_readings_in_kafka} "
        f"readings ({loss.archived} archived, {loss.late} late); duplicates {loss.duplicates}"
    )
    console.print(
        f"  alerts vs replay {verdict(alerts.ok)}: live {alerts.live}, replay {alerts.replay}, same {alerts.same}"
    )
    console.print(
        f"  notifications {verdict(notes.ok)}: {notes.alert_records} alert records, {notes.posts_received} "
        f"posts, {notes.duplicates_removed_by_key} repeats removed by Idempotency-Key"
    )
    console.print(
        f"  commands {verdict(commands.ok)}: {commands.commands} ({commands.acknowledged} acknowledged, "
        f"{commands.expired} expired, open {len(commands.open)})"
    )
    console.print(f"  recovery {verdict(summary.recovery.ok)}:")
    for fault in summary.faults:
        console.print(
            f"    {fault['injected_at_s']:>7} s  {fault['fault']:<18} down {fault['down_s']} s, "
            f"recovered after {fault['recovery_s']} s (lag then {fault['lag_at_recovery']})"
            + (f"; not recovered: waiting for {fault['waiting_for']}" if fault.get("waiting_for") else "")
            + (f"; lag back to steady after {fault['caught_up_s']} s" if fault.get("caught_up_s") is not None else "")
        )
    lag = summary.lag
    console.print(
        f"  lag back to {lag.level_s:g} s of input ({lag.level} records) after each fault "
        f"{verdict(lag.ok)}: {lag.judged} judged"
        + (f", not caught up after {', '.join(lag.not_caught_up)}" if lag.not_caught_up else "")
    )
    resources = summary.resources
    console.print(f"  resources {verdict(resources.ok)} (judged: {', '.join(resources.judged) or 'none'}):")
    for name, entry in resources.processes.items():
        rss, anon = entry["rss_bytes"], entry["anon_bytes"]
        judged = "not judged (too short)" if entry["within_limits"] is None else verdict(entry["within_limits"])
        console.print(
            f"    {name:<9} {judged}: RSS {rss['last'] / 2**20:.1f} MiB, slope {rss['slope_per_min']} B/min; "
            f"anonymous {anon['last'] / 2**20:.1f} MiB, slope {anon['slope_per_min']} B/min; "
            f"fds {entry['fds']['slope_per_min']}/min, data files {entry['data_files']['slope_per_min']}/min; "
            f"threads {entry['threads']['slope_per_min']}/min"
        )
    if summary.unplanned_exits:
        console.print(f"  [red]ended without a fault: {summary.unplanned_exits}[/red]")
    if summary.report:
        console.print(f"  report: {summary.report.folder}")
