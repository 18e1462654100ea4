"""What a receiver is sent: one alert record (``record`` receivers, ``alerts forward --webhook``)
or one group notification, as JSON with a Slack-compatible ``text``; ``pagerduty`` and
``alertmanager`` receivers get those tools' APIs (:mod:`iotwatch.alerts.paging_apis`).
docs/operate/oncall.md ("What receivers are sent") gives the request format.
"""

from __future__ import annotations

from typing import Any

from iotwatch.alerts.book import AlertView
from iotwatch.alerts.paging_apis import alertmanager_alerts, pagerduty_events
from iotwatch.alerts.records import CLEARED_EMOJI, EMOJI, headline, slack_text
from iotwatch.alerts.routing import Receiver, Route
from iotwatch.contract.alerts import AlertRecord, alert_as_dict, severity_rank
from iotwatch.contract.oncall import NotificationKind


def record_body(alert: AlertRecord) -> dict[str, Any]:
    """A ``record`` receiver's body: the alert record unchanged plus a Slack-compatible ``text``."""
    return {**alert_as_dict(alert), "text": slack_text(alert)}


def record_key(alert: AlertRecord) -> str:
    """A ``record`` receiver's ``Idempotency-Key``: the same for every post of this record."""
    return f"{alert.alert_id}:{alert.state}"


def posts(
    receiver: str,
    config: Receiver,
    route: Route,
    group_key: str,
    kind: NotificationKind,
    firing: list[AlertView],
    resolved: list[AlertView],
    repeated: list[str],
    key: str,
    now_ms: int,
) -> list[tuple[Any, str]]:
    """What one group notification sends ``receiver``: (body, ``Idempotency-Key``) per post."""
    if config.format == "pagerduty":
        return pagerduty_events(config.routing_key or "", firing, resolved)
    if config.format == "alertmanager":
        return [(alertmanager_alerts(firing, resolved, now_ms, config.resolve_after, config.generator_url), key)]
    labels = {name: (firing or resolved)[0].record.field(name) for name in route.group_by} if firing or resolved else {}
    text = _text(kind, labels, firing, resolved, repeated)
    if config.format == "slack":
        return [({"text": text}, key)]
    body = {
        "receiver": receiver,
        "status": "firing" if firing else "resolved",
        "kind": kind.value,
        "group_key": group_key,
        "group_labels": labels,
        "alerts": [_alert(v) for v in firing],
        "resolved": [_alert(v) for v in resolved],
        "repeated": repeated,
        "text": text,
    }
    return [(body, key)]


def _alert(view: AlertView) -> dict[str, Any]:
    return {**view.as_dict(), "runbook_url": view.record.runbook_url}


def _text(
    kind: NotificationKind,
    labels: dict[str, Any],
    firing: list[AlertView],
    resolved: list[AlertView],
    repeated: list[str],
) -> str:
    where = " ".join(f"{k}={v}" for k, v in labels.items())
    lines = []
    if firing:
        worst = min((v.record.severity for v in firing), key=severity_rank)
        acked = sum(v.acked for v in firing)
        extra = f" (repeat: {len(repeated)} unacknowledged critical)" if kind == NotificationKind.REPEAT else ""
        extra += f", {acked} acknowledged" if acked else ""
        lines.append(f"{EMOJI.get(str(worst), ':grey_question:')} [FIRING:{len(firing)}] {where}{extra}")
        lines += [_line(v) for v in firing]
    if resolved:
        lines.append(f"{CLEARED_EMOJI} [RESOLVED:{len(resolved)}] {where}")
        lines += [_line(v) for v in resolved]
    return "\n".join(lines)


def _line(view: AlertView) -> str:
    record = view.cleared or view.record
    text = f"• {headline(record)}"
    ack = view.acknowledgement
    if ack is not None:
        text += f" (acknowledged by {ack.by}" + (f": {ack.note})" if ack.note else ")")
    runbook = view.record.runbook_url
    if runbook:
        text += f" <{runbook}|runbook>"
    return text
