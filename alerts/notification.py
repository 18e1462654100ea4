"""The body of one group notification: a JSON document with a Slack-compatible ``text``.

``json`` receivers get::

    {"receiver": "oncall", "status": "firing", "kind": "firing", "group_key": "0.1:{site=home-1,rule=leak}",
     "group_labels": {"site": "home-1", "rule": "water_leak"},
     "alerts": [{...alert record..., "status": "open", "acked_by": null, "runbook_url": "https://..."}],
     "resolved": [{...}], "repeated": ["<alert id>", ...],
     "text": ":red_circle: [FIRING:2] site=home-1 rule=water_leak\\n• [CRITICAL] water_leak raised on ..."}

``slack`` receivers get only ``{"text": ...}`` (Slack, Mattermost and Rocket.Chat incoming
webhooks take it as is; runbooks as ``<url|runbook>`` links).
"""

from __future__ import annotations

from typing import Any

from alerts.book import AlertView
from alerts.records import CLEARED_EMOJI, EMOJI, headline, severity_rank
from alerts.routing import Route
from iotwatch.contract.oncall import NotificationKind


def body(
    receiver: str,
    receiver_format: str,
    route: Route,
    group_key: str,
    kind: NotificationKind,
    firing: list[AlertView],
    resolved: list[AlertView],
    repeated: list[str],
) -> dict[str, Any]:
    labels = {name: (firing or resolved)[0].record.field(name) for name in route.group_by} if firing or resolved else {}
    text = _text(kind, labels, firing, resolved, repeated)
    if receiver_format == "slack":
        return {"text": text}
    return {
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


def _alert(view: AlertView) -> dict[str, Any]:
    state = view.as_dict()
    return {**state, "runbook_url": view.record.runbook_url}


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
    if view.acked:
        text += f" (acknowledged by {view.ack.by}" + (f": {view.ack.note})" if view.ack.note else ")")  # type: ignore[union-attr]
    runbook = view.record.runbook_url
    if runbook:
        text += f" <{runbook}|runbook>"
    return text
