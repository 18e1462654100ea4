"""The demo's on-call side against the real broker: the on-call person acknowledges the
oldest open alert (never a silent device), and the local receiver takes a routed notification."""

from __future__ import annotations

import time
from pathlib import Path

import requests

from iotwatch.alerts.book import load_book
from iotwatch.alerts.routing import load_routing
from iotwatch.application.demo.oncall_person import ON_CALL, OnCallPerson
from iotwatch.application.harness.receiver import Receiver
from iotwatch.settings import Settings
from tests.support.alerts import make_alert, produce


def test_on_call_person_acknowledges_the_oldest_open_alert(test_settings: Settings, tmp_path: Path) -> None:
    start = int(time.time() * 1000) - 60_000
    old = make_alert("leak-1", "leak_sensor", "home-1", "water_leak", "critical", "raised", start, detected_at_ms=start)
    newer = make_alert(
        "t-1", "thermostat", "home-1", "stuck_hvac", "major", "raised", start + 10, detected_at_ms=start + 10_000
    )
    silent = make_alert(
        "d-1", "door_sensor", "home-1", "device_silent", "major", "raised", start - 10, detected_at_ms=start - 10_000
    )
    produce(test_settings.kafka, test_settings.topics.alerts, [old, newer, silent])
    person = OnCallPerson(test_settings, every_s=0, min_age_s=1)
    person.step()
    assert person.acknowledged == [old.alert_id]
    book = load_book(test_settings)
    assert book.alerts[old.alert_id].ack.by == ON_CALL  # type: ignore[union-attr]
    person.step()
    assert person.acknowledged == [old.alert_id, newer.alert_id]
    person.step()  # only the silent device is left: not for the demo's on-call person
    assert len(person.acknowledged) == 2

    receiver = Receiver()
    try:
        tree = load_routing(receiver.write_routes(tmp_path / "routes.toml"))
        assert [r.receiver for r in tree.routes(old)] == ["demo"]
        assert requests.post(receiver.url, json={"text": "hi"}).status_code == 200
        assert receiver.notifications == 1
    finally:
        receiver.close()
