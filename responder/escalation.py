"""Escalation as an alert: when commands could not fix a condition, on-call is paged through
the same path as every alert -- a ``command_escalation`` record (critical) on the alert
topic, which the forwarder routes, repeats until acknowledged, and resolves when the original
alert clears. Its id is derived from the original alert and the policy, so a responder that
restarts writes the same record again, not a second escalation."""

from __future__ import annotations

from typing import Any

from iotwatch.oncall import CommandAudit, iso_time, stable_id

RULE = "command_escalation"
SEVERITY = "critical"


def escalation_id(alert_id: str, policy: str) -> str:
    return stable_id(alert_id, policy, RULE, length=24)


def escalation_record(
    original: dict[str, Any], audit: CommandAudit, state: str, why: str, now_ms: int, runbook_url: str
) -> dict[str, Any]:
    """The ``raised`` or ``cleared`` alert record (the fields of streaming.alerting's records
    that apply) for the escalation of ``audit``'s alert."""
    where = f"{audit.device_type} {audit.device_id} at {audit.site}"
    verb = "raised" if state == "raised" else "cleared"
    detail = (
        f"{audit.name} did not fix {audit.rule} after {audit.attempt} attempt(s): {why}"
        if state == "raised"
        else f"{audit.rule} cleared"
    )
    first_ms = int(original.get("first_event_ms") or now_ms)
    return {
        "alert_id": escalation_id(audit.alert_id, audit.policy),
        "state": state,
        "severity": SEVERITY,
        "rule": RULE,
        "detector": "responder",
        "device_id": audit.device_id,
        "device_type": audit.device_type,
        "site": audit.site,
        "metric": None,
        "value": None,
        "score": 1.0,
        "contributors": [],
        "first_event_ms": first_ms,
        "first_event_time": iso_time(first_ms),
        "detected_at": iso_time(now_ms),
        "detected_at_ms": now_ms,
        "caused_by": audit.alert_id,
        "command_id": audit.command_id,
        "policy": audit.policy,
        "message": f"[{SEVERITY.upper()}] {RULE} {verb} on {where}: {detail} (alert {audit.alert_id})",
        "runbook_url": runbook_url,
    }
