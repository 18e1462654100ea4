"""What receivers that speak an on-call tool's own API are sent: PagerDuty and Alertmanager.

``format = "pagerduty"``: the `PagerDuty Events API v2
<https://developer.pagerduty.com/docs/events-api-v2/trigger-events/>`_, one event per alert with
the alert id as ``dedup_key``, so PagerDuty keeps one alert per iotwatch alert.
``format = "alertmanager"``: Alertmanager's ``POST /api/v2/alerts``, one post per notification.
docs/operate/oncall.md ("PagerDuty and Alertmanager") gives the fields each is sent.
"""

from __future__ import annotations

from typing import Any

from iotwatch.alerts.book import AlertView
from iotwatch.contract.alerts import AlertRecord, Severity, alert_as_dict, iso_time

#: iotwatch severities as PagerDuty's (critical, error, warning, info).
PAGERDUTY_SEVERITY: dict[str, str] = {
    Severity.CRITICAL: "critical",
    Severity.MAJOR: "error",
    Severity.MINOR: "warning",
    Severity.WARNING: "warning",
}
#: Alert fields that become Alertmanager labels (``alertname`` is the rule), when set.
ALERTMANAGER_LABELS = ("site", "device_id", "device_type", "severity", "detector", "metric")
#: PagerDuty's limits on a summary and a dedup key.
_SUMMARY_MAX, _DEDUP_MAX = 1024, 255


def pagerduty_events(
    routing_key: str, firing: list[AlertView], resolved: list[AlertView]
) -> list[tuple[dict[str, Any], str]]:
    """One Events API v2 event per alert, each with its ``Idempotency-Key``
    (``<alert id>:<action>``: the same on every retry)."""
    events = []
    for view in firing:
        action = "acknowledge" if view.acked else "trigger"
        events.append((_pagerduty_event(routing_key, action, view.record), f"{view.alert_id}:{action}"))
    for view in resolved:
        record = view.cleared or view.record
        events.append((_pagerduty_event(routing_key, "resolve", record), f"{view.alert_id}:resolve"))
    return events


def _pagerduty_event(routing_key: str, action: str, record: AlertRecord) -> dict[str, Any]:
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": action,
        "dedup_key": record.alert_id[:_DEDUP_MAX],
    }
    if action != "trigger":
        return event  # acknowledge and resolve name the alert by its dedup key alone
    event["payload"] = {
        "summary": record.message[:_SUMMARY_MAX],
        "source": record.device_id,
        "severity": PAGERDUTY_SEVERITY[record.severity],
        "timestamp": iso_time(record.first_event_ms),
        "component": record.device_type,
        "group": record.site,
        "class": record.rule,
        "custom_details": alert_as_dict(record),
    }
    event["client"] = "iotwatch"
    if record.runbook_url:
        event["links"] = [{"href": record.runbook_url, "text": "runbook"}]
    return event


def alertmanager_alerts(
    firing: list[AlertView], resolved: list[AlertView], now_ms: int, resolve_after_s: float, generator_url: str | None
) -> list[dict[str, Any]]:
    """The notification's alerts as Alertmanager's ``postableAlerts``."""
    alerts = []
    for view in firing:
        ends = now_ms + int(resolve_after_s * 1000)
        alerts.append(_alertmanager_alert(view.record, ends, generator_url))
    for view in resolved:
        ends = (view.cleared or view.record).detected_at_ms
        alerts.append(_alertmanager_alert(view.record, max(ends, view.record.first_event_ms), generator_url))
    return alerts


def _alertmanager_alert(record: AlertRecord, ends_ms: int, generator_url: str | None) -> dict[str, Any]:
    labels = {"alertname": record.rule}
    labels.update({name: str(value) for name in ALERTMANAGER_LABELS if (value := record.field(name)) is not None})
    annotations = {"summary": record.message, "description": record.message, "alert_id": record.alert_id}
    if record.runbook_url:
        annotations["runbook_url"] = record.runbook_url
    alert: dict[str, Any] = {
        "labels": labels,
        "annotations": annotations,
        "startsAt": iso_time(record.first_event_ms),
        "endsAt": iso_time(ends_ms),
    }
    if generator_url:
        alert["generatorURL"] = generator_url
    return alert
