"""``alerts forward --routes`` to PagerDuty and Alertmanager receivers: real HTTP servers that
check every request against each API's published schema, fed from the real broker."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from iotwatch.alerts.dispatch import Dispatcher
from iotwatch.alerts.routing import parse_routing
from iotwatch.contract.alerts import iso_time
from iotwatch.settings import AlertsSettings, Settings
from tests.helpers import InThread, wait_for
from tests.support.alerts import make_alert, produce
from tests.support.paging_schemas import ALERTMANAGER_ALERTS, PAGERDUTY_EVENT

ROUTING_KEY = "R0123456789abcdef0123456789abcde"


def test_pagerduty_and_alertmanager_receivers_trigger_and_resolve_with_schema_valid_payloads(
    test_settings: Settings, tmp_path: Path, schema_receiver: Any
) -> None:
    pager, pager_url = schema_receiver(PAGERDUTY_EVENT)
    manager, manager_url = schema_receiver(ALERTMANAGER_ALERTS)
    tree = parse_routing(
        {
            "receivers": {
                "pager": {"url": f"{pager_url}/v2/enqueue", "format": "pagerduty", "routing_key": ROUTING_KEY},
                "am": {
                    "url": f"{manager_url}/api/v2/alerts",
                    "format": "alertmanager",
                    "generator_url": "http://grafana.example/d/iotwatch-oncall",
                },
            },
            "route": {
                "receiver": "pager",
                "group_by": ["site"],
                "group_wait": "0.5s",
                "group_interval": "1s",
                "routes": [{"match": {}, "receiver": "am", "continue": True}, {"match": {}, "receiver": "pager"}],
            },
        }
    )
    start = int(time.time() * 1000) - 60_000
    leak = make_alert("leak-1", "leak_sensor", "home-1", "water_leak", "critical", "raised", start)
    hvac = make_alert(
        "hvac-1", "thermostat", "home-1", "stuck_hvac", "major", "raised", start + 1000, runbook_url="https://wiki/hvac"
    )
    produce(test_settings.kafka, test_settings.topics.alerts, [leak, hvac])
    config = AlertsSettings(state_dir=tmp_path, retry_initial_s=0.05, retry_max_s=0.5)
    running = InThread(lambda stop: Dispatcher(test_settings, config, tree, stop))
    try:
        wait_for(lambda: len(pager.accepted) >= 2 and manager.accepted, 60, "a trigger per alert and one post")
        cleared = make_alert("hvac-1", "thermostat", "home-1", "stuck_hvac", "major", "cleared", start + 1000)
        produce(test_settings.kafka, test_settings.topics.alerts, [cleared])
        wait_for(lambda: len(pager.accepted) >= 3 and len(manager.accepted) >= 2, 60, "the clear's resolve")
    finally:
        running.close()

    assert pager.refused == [] and manager.refused == []  # every request fits the published schema
    triggers = {e["dedup_key"]: e for e in pager.accepted if e["event_action"] == "trigger"}
    assert set(triggers) == {leak.alert_id, hvac.alert_id}  # dedup key = alert id: one PagerDuty alert each
    assert triggers[leak.alert_id]["payload"]["severity"] == "critical"
    assert triggers[hvac.alert_id]["payload"]["severity"] == "error"  # major
    assert triggers[hvac.alert_id]["payload"]["source"] == "hvac-1"
    assert triggers[hvac.alert_id]["payload"]["summary"] == hvac.message
    assert triggers[hvac.alert_id]["links"] == [{"href": "https://wiki/hvac", "text": "runbook"}]
    assert all(e["routing_key"] == ROUTING_KEY for e in pager.accepted)
    resolves = [e for e in pager.accepted if e["event_action"] == "resolve"]
    assert resolves == [{"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": hvac.alert_id}]

    first, last = manager.accepted[0], manager.accepted[-1]
    by_name = {a["labels"]["device_id"]: a for a in first}
    assert set(by_name) == {"leak-1", "hvac-1"}
    assert by_name["hvac-1"]["labels"] == {
        "alertname": "stuck_hvac",
        "site": "home-1",
        "device_id": "hvac-1",
        "device_type": "thermostat",
        "severity": "major",
        "detector": "rule",
        "metric": "temperature_c",
    }
    assert by_name["hvac-1"]["annotations"]["runbook_url"] == "https://wiki/hvac"
    assert by_name["hvac-1"]["startsAt"] == iso_time(start + 1000)
    assert by_name["hvac-1"]["generatorURL"] == "http://grafana.example/d/iotwatch-oncall"
    assert by_name["hvac-1"]["endsAt"] > iso_time(int(time.time() * 1000) + 3600_000)  # firing: ends far ahead
    ended = [a for a in last if a["labels"]["device_id"] == "hvac-1"]
    assert ended and ended[0]["endsAt"] == iso_time(cleared.detected_at_ms)  # the clear ends it
