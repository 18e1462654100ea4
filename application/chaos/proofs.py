"""What a chaos run proves from the data it left (loss, alerts against a replay,
notifications, commands, recovery, lag), each a small verdict with the figures that decided
it; docs/operate/chaos.md, *Proofs*, says what each reads.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import msgspec

from iotwatch.application.harness.accounting import Loss
from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.oncall import CommandAudit, CommandOutcome
from iotwatch.stats import quantiles

#: The rule of the responder's escalations: raised by the responder, not by the job.
RESPONDER_RULE = "command_escalation"
#: The live job's pipeline incidents: the faults themselves, which a replay does not see.
PIPELINE_RULE = "ingestion_gap"

ACKNOWLEDGED = (CommandOutcome.DONE, CommandOutcome.REJECTED, CommandOutcome.FAILED)
EXPIRED = (CommandOutcome.TIMED_OUT, CommandOutcome.ESCALATED)


class Proof(msgspec.Struct, kw_only=True):
    """A verdict (``ok``) with the figures that decided it."""

    ok: bool


class LossProof(Loss, kw_only=True):
    """Loss by seq (none, of a raw topic that is not empty), and the copies on the way."""

    ok: bool
    #: the raw topic's copies beyond the first, the gateway's count, the job's removals since its last start
    duplicates: dict[str, int | None]
    dead_letters_by_stage_and_reason: dict[str, int]


class AlertsProof(Proof, kw_only=True):
    live: int
    replay: int
    same: int
    responder_escalations_left_out: int
    ingestion_gaps_left_out: int
    only_live: dict[str, str]
    only_replay: dict[str, str]


class NotificationsProof(Proof, kw_only=True):
    alert_records: int
    posts_received: int
    unique_after_dedup: int
    duplicates_removed_by_key: int
    keys_repeated: int
    missing: list[str]
    unexpected: list[str]


class CommandsProof(Proof, kw_only=True):
    commands: int
    acknowledged: int
    expired: int
    audit_records: int
    by_status: dict[str, int]
    open: list[str]


class RecoveryProof(Proof, kw_only=True):
    faults: int
    not_recovered: list[str]
    waiting_for: dict[str, str]
    recovery_s_by_fault: dict[str, dict[str, float | None]]
    restarted: dict[str, int]
    never_restarted: list[str]


class CatchUpProof(Proof, kw_only=True):
    level: int
    level_s: float
    lead_in_max_lag: int | None
    judged: int
    caught_up_s: dict[str, float | None] | None
    not_caught_up: list[str]


def alerts_match(live: dict[str, AlertRecord], replay: dict[str, AlertRecord]) -> AlertsProof:
    """Raised alert ids of the live job against the replay's (alert id -> raised record)."""
    job = {alert_id: a for alert_id, a in live.items() if a.rule not in (RESPONDER_RULE, PIPELINE_RULE)}
    only_live, only_replay = sorted(set(job) - set(replay)), sorted(set(replay) - set(job))
    return AlertsProof(
        ok=not only_live and not only_replay and bool(job),
        live=len(job),
        replay=len(replay),
        same=len(set(job) & set(replay)),
        responder_escalations_left_out=sum(a.rule == RESPONDER_RULE for a in live.values()),
        ingestion_gaps_left_out=sum(a.rule == PIPELINE_RULE for a in live.values()),
        only_live={i: job[i].rule for i in only_live[:20]},
        only_replay={i: replay[i].rule for i in only_replay[:20]},
    )


def notifications(alerts: Iterable[AlertRecord], received: Counter[str]) -> NotificationsProof:
    """Each alert record's ``<alert_id>:<state>`` against the keys the receiver got."""
    expected = {f"{a.alert_id}:{a.state}" for a in alerts}
    missing = sorted(expected - set(received))
    repeats = {key: n for key, n in received.items() if n > 1}
    return NotificationsProof(
        ok=not missing,
        alert_records=len(expected),
        posts_received=sum(received.values()),
        unique_after_dedup=len(received),
        duplicates_removed_by_key=sum(n - 1 for n in repeats.values()),
        keys_repeated=len(repeats),
        missing=missing[:20],
        unexpected=sorted(set(received) - expected)[:20],
    )


def commands(audits: Iterable[CommandAudit]) -> CommandsProof:
    """The latest audit record per command: acknowledged (a final reply), expired, or open."""
    audits = list(audits)
    latest = {audit.command_id: audit for audit in audits}
    outcome = Counter(a.status.value for a in latest.values())
    still_open = sorted(i for i, a in latest.items() if a.status not in (*ACKNOWLEDGED, *EXPIRED))
    return CommandsProof(
        ok=not still_open,
        commands=len(latest),
        acknowledged=sum(1 for a in latest.values() if a.status in ACKNOWLEDGED),
        expired=sum(1 for a in latest.values() if a.status in EXPIRED),
        audit_records=len(audits),
        by_status=dict(sorted(outcome.items())),
        open=still_open[:20],
    )


def recovery(faults: list[dict[str, Any]], restarted: dict[str, int]) -> RecoveryProof:
    """Every fault recovered; recovery seconds per fault kind; each target started again
    (``restarted``: target -> starts after the first)."""
    by_kind: dict[str, list[float]] = {}
    for fault in faults:
        if fault["recovery_s"] is not None:
            by_kind.setdefault(fault["fault"], []).append(fault["recovery_s"])
    failed = [f["fault"] for f in faults if not f["recovered"] or f.get("error")]
    never = sorted(target for target, n in restarted.items() if n < 1)
    return RecoveryProof(
        ok=bool(faults) and not failed and not never,
        faults=len(faults),
        not_recovered=failed,
        waiting_for={f["fault"]: f["waiting_for"] for f in faults if f.get("waiting_for")},
        recovery_s_by_fault={
            kind: {**quantiles(values, (0.5, 1.0), digits=1), "n": len(values)} for kind, values in by_kind.items()
        },
        restarted=restarted,
        never_restarted=never,
    )


#: The shortest stretch from a fault's recovery to the next fault in which the lag is judged:
#: a backlog of a few seconds' load takes the job a few micro-batches to clear.
CATCH_UP_WINDOW_S = 20.0

#: The lag a job that keeps up falls to between micro-batches, in seconds of input: a
#: micro-batch a second and a few seconds for the slowest of them.
LAG_LEVEL_S = 10.0


def catch_up(
    faults: list[dict[str, Any]],
    lag: list[tuple[float, int]],
    load_s: float,
    rate: float,
    window_s: float = CATCH_UP_WINDOW_S,
) -> CatchUpProof:
    """Whether the job's lag (raw topic end minus its committed offset, ``(t_s, lag)`` samples)
    fell back to the level of a job that keeps up after each recovered fault, before the next
    fault: :data:`LAG_LEVEL_S` seconds of input at ``rate`` records a second. A fault whose
    recovery the next fault follows within ``window_s`` is not judged. Adds ``caught_up_s``
    (seconds from recovery) to each judged fault; reports the lead-in's highest lag (the
    start-up backlog included) beside the level."""
    first = min((f["injected_at_s"] for f in faults if f["injected_at_s"] is not None), default=load_s)
    before = [value for t, value in lag if t < first]
    level = int(rate * LAG_LEVEL_S)
    starts = sorted(f["injected_at_s"] for f in faults if f["injected_at_s"] is not None)
    judged, late, seconds = 0, [], []
    for fault in faults:
        if fault["recovery_s"] is None:
            continue
        recovered = fault["injected_at_s"] + fault["recovery_s"]
        end = min((t for t in starts if t > fault["injected_at_s"]), default=load_s)
        window = [(t, value) for t, value in lag if recovered <= t < end]
        if end - recovered < window_s or len(window) < 2:
            continue
        judged += 1
        back = next((t for t, value in window if value <= level), None)
        fault["caught_up_s"] = None if back is None else round(back - recovered, 1)
        if back is None:
            late.append(fault["fault"])
        else:
            seconds.append(back - recovered)
    return CatchUpProof(
        ok=not late,
        level=level,
        level_s=LAG_LEVEL_S,
        lead_in_max_lag=max(before) if before else None,
        judged=judged,
        caught_up_s=quantiles(seconds, (0.5, 1.0), digits=1) if seconds else None,
        not_caught_up=late,
    )
