"""The closed loop's figures in the demo summary: alert -> command -> device ack -> recovery
(docs/internals.md, "Demo closed loop")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import msgspec

from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.ground_truth import Injection
from iotwatch.contract.oncall import CommandAudit, CommandOutcome
from iotwatch.responder.command_policy import OPEN
from iotwatch.stats import quantiles


def timings(
    audits: Iterable[CommandAudit], alerts: Iterable[AlertRecord]
) -> tuple[dict[str, CommandAudit], dict[str, list[int]]]:
    """The latest record per command, and the three timings in ms (``time_to_command``,
    ``time_to_device_ack``, ``time_to_recovery``), one value per command that has it."""
    latest = latest_audits(audits)
    alerts = list(alerts)
    raised = {a.alert_id: a for a in alerts if a.raised}
    cleared = {a.alert_id: a for a in alerts if not a.raised}
    found: dict[str, list[int]] = {name: [] for name in TIMINGS}
    for audit in latest.values():
        alert = raised.get(audit.alert_id)
        if alert is not None:
            found["time_to_command"].append(audit.issued_at_ms - alert.detected_at_ms)
        accepted = next((s for s in audit.history if s.status == CommandOutcome.ACCEPTED), None)
        if accepted is not None:
            found["time_to_device_ack"].append(accepted.at_ms - audit.issued_at_ms)
        clear = cleared.get(audit.alert_id)
        if clear is not None and audit.status == CommandOutcome.DONE:
            found["time_to_recovery"].append(clear.detected_at_ms - audit.issued_at_ms)
    return latest, found


def latest_audits(audits: Iterable[CommandAudit]) -> dict[str, CommandAudit]:
    """The latest record per command id, of the commands topic's records in order."""
    return {audit.command_id: audit for audit in audits}


#: The outcomes only a device's reply gives (a command rejected as expired was answered too).
ANSWERED = frozenset({CommandOutcome.ACCEPTED, CommandOutcome.DONE, CommandOutcome.FAILED, CommandOutcome.REJECTED})


class CommandCounts(msgspec.Struct, kw_only=True):
    sent: int
    acknowledged: int
    done: int
    expired: int
    open: int
    outcomes: dict[str, int]


class Percentiles(msgspec.Struct, kw_only=True):
    """Seconds (wall clock) over ``n`` commands."""

    p50: float | None
    p99: float | None
    n: int

    def __str__(self) -> str:
        return f"{self.p50}/{self.p99} s"


class ClosedLoop(msgspec.Struct, kw_only=True):
    commands: int
    outcomes: dict[str, int]
    time_to_command_s: Percentiles
    time_to_device_ack_s: Percentiles
    time_to_recovery_s: Percentiles
    anomalies_ended_by_command: int


def by_outcome(audits: Iterable[CommandAudit]) -> CommandCounts:
    """Commands (latest records) by what became of them: ``acknowledged`` by the device
    (any reply), ``done``, ``expired`` without any reply (timed out), still ``open``."""
    audits = list(audits)
    steps = [{step.status for step in audit.history} for audit in audits]
    return CommandCounts(
        sent=len(audits),
        acknowledged=sum(1 for s in steps if s & ANSWERED),
        done=sum(1 for s in steps if CommandOutcome.DONE in s),
        expired=sum(1 for s in steps if not s & ANSWERED and CommandOutcome.TIMED_OUT in s),
        open=sum(1 for audit in audits if audit.status in OPEN),
        outcomes=dict(sorted(Counter(audit.status.value for audit in audits).items())),
    )


#: The closed loop's timings: alert -> command, command -> device ack, command -> alert cleared.
TIMINGS = ("time_to_command", "time_to_device_ack", "time_to_recovery")


def summarise(audits: Iterable[CommandAudit], alerts: Iterable[AlertRecord], truth: Iterable[Injection]) -> ClosedLoop:
    latest, found = timings(audits, alerts)
    return ClosedLoop(
        commands=len(latest),
        outcomes=dict(Counter(a.status.value for a in latest.values())),
        time_to_command_s=_percentiles(found["time_to_command"]),
        time_to_device_ack_s=_percentiles(found["time_to_device_ack"]),
        time_to_recovery_s=_percentiles(found["time_to_recovery"]),
        anomalies_ended_by_command=sum(1 for r in truth if r.ended_by_command),
    )


def _percentiles(values_ms: list[int]) -> Percentiles:
    if not values_ms:
        return Percentiles(p50=None, p99=None, n=0)
    found = quantiles([v / 1000.0 for v in values_ms], (0.5, 0.99), digits=3)
    return Percentiles(p50=found["p50"], p99=found["p99"], n=len(values_ms))
