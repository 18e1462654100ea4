"""Escalation as an alert: when commands could not fix a condition, on-call is paged through
the same path as every alert -- a ``command_escalation`` record (critical) on the alert
topic, which the forwarder routes, repeats until acknowledged, and resolves when the original
alert clears. Its id is derived from the original alert and the policy, so a responder that
restarts writes the same record again, not a second escalation."""

from __future__ import annotations

from iotwatch.contract.alerts import AlertLifecycle, AlertRecord, Severity
from iotwatch.contract.detection import Rule
from iotwatch.contract.oncall import CommandAudit, stable_id

RULE = Rule.COMMAND_ESCALATION.value
SEVERITY = Severity.CRITICAL


def escalation_id(alert_id: str, policy: str) -> str:
    return stable_id(alert_id, policy, RULE, length=24)


def escalation_record(
    original: AlertRecord,
    audit: CommandAudit,
    state: AlertLifecycle,
    why: str,
    now_ms: int,
    runbook_url: str,
) -> AlertRecord:
    """The ``raised`` or ``cleared`` alert record for the escalation of ``audit``'s alert; it
    starts when the original alert did."""
    where = f"{audit.device_type} {audit.device_id} at {audit.site}"
    raised = state == AlertLifecycle.RAISED
    detail = (
        f"{audit.name} did not fix {audit.rule} after {audit.attempt} attempt(s): {why}"
        if raised
        else f"{audit.rule} cleared"
    )
    verb = "raised" if raised else "cleared"
    return AlertRecord(
        alert_id=escalation_id(audit.alert_id, audit.policy),
        state=state,
        severity=SEVERITY,
        rule=RULE,
        detector="responder",
        device_id=audit.device_id,
        device_type=audit.device_type,
        site=audit.site,
        score=1.0,
        first_event_ms=original.first_event_ms,
        detected_at_ms=now_ms,
        caused_by=audit.alert_id,
        command_id=audit.command_id,
        policy=audit.policy,
        message=f"[{SEVERITY.upper()}] {RULE} {verb} on {where}: {detail} (alert {audit.alert_id})",
        runbook_url=runbook_url,
    )
