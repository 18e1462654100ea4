"""PagerDuty and Alertmanager bodies from alert views, checked against the published schemas
(no server): severities, acknowledgements, the receiver's own settings."""

from __future__ import annotations

import pytest

from iotwatch.alerts.book import AlertView
from iotwatch.alerts.paging_apis import PAGERDUTY_SEVERITY, alertmanager_alerts, pagerduty_events
from iotwatch.alerts.routing import RoutingError, parse_routing
from iotwatch.contract.alerts import Severity
from iotwatch.contract.oncall import ONCALL_SCHEMA_VERSION, AlertState, AlertStep
from tests.support.alerts import make_alert
from tests.support.paging_schemas import ALERTMANAGER_ALERTS, PAGERDUTY_EVENT, check


def _view(severity: str, *, acked: bool = False, cleared: bool = False) -> AlertView:
    args = ("m-1", "smart_meter", "home-1", "anomaly_score", severity)
    raised = make_alert(*args, "raised", 1_000, metric=None)
    ack = AlertState(ONCALL_SCHEMA_VERSION, raised.alert_id, AlertStep.ACKNOWLEDGED, "bob", 2_000) if acked else None
    return AlertView(raised.alert_id, raised, make_alert(*args, "cleared", 1_000) if cleared else None, ack)


def test_every_severity_maps_to_pagerduty_and_every_event_fits_the_schema() -> None:
    assert set(PAGERDUTY_SEVERITY) == {s.value for s in Severity}
    firing = [_view(s.value) for s in Severity] + [_view("critical", acked=True)]
    events = pagerduty_events("key", firing, [_view("minor", cleared=True)])
    assert [check(PAGERDUTY_EVENT, body) for body, _ in events] == [[]] * len(events)
    actions = [(body["event_action"], body.get("payload", {}).get("severity")) for body, _ in events]
    assert actions == [
        ("trigger", "critical"),
        ("trigger", "error"),
        ("trigger", "warning"),
        ("trigger", "warning"),
        ("acknowledge", None),  # acknowledged in iotwatch: acknowledged in PagerDuty
        ("resolve", None),
    ]
    assert [key for _, key in events][-2:] == [
        f"{firing[-1].alert_id}:acknowledge",
        f"{events[-1][0]['dedup_key']}:resolve",
    ]


def test_alertmanager_alerts_fit_the_schema_without_a_metric_or_generator_url() -> None:
    alerts = alertmanager_alerts([_view("warning")], [_view("major", cleared=True)], 5_000, 60.0, None)
    assert check(ALERTMANAGER_ALERTS, alerts) == []
    assert "metric" not in alerts[0]["labels"] and "generatorURL" not in alerts[0]
    assert alerts[0]["endsAt"] == "1970-01-01T00:01:05.000Z"  # 60 s after now: renewed by the next notification


def test_a_pagerduty_receiver_needs_its_routing_key() -> None:
    route = {"receiver": "pd"}
    with pytest.raises(RoutingError, match="receivers.pd: .*needs routing_key"):
        parse_routing(
            {"receivers": {"pd": {"url": "https://events.example/v2/enqueue", "format": "pagerduty"}}, "route": route}
        )
    tree = parse_routing(
        {
            "receivers": {
                "am": {"url": "http://am:9093/api/v2/alerts", "format": "alertmanager", "resolve_after": "2h"}
            },
            "route": {"receiver": "am"},
        }
    )
    assert tree.receivers["am"].resolve_after == 7200.0
