"""The forwarder's grouping and retries on an injected clock: group_wait, the back-off after a
failed post and a receiver's Retry-After are times the test sets, not waits it sleeps through.

The receivers are the flaky webhook of ``tests/support/alerts.py`` answering 503 or 429, so
no notification is ever delivered and none is recorded on Kafka: no broker is needed (the
delivered path, which records the notification, is tested on the real broker in
``tests/integration/alerts/test_dispatch.py``; the policy's repeats and group_interval in
``tests/unit/alerts/test_notify_policy.py``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from iotwatch.alerts.dispatch import Dispatcher
from iotwatch.alerts.routing import parse_routing
from iotwatch.contract.alerts import AlertRecord, alert_message
from iotwatch.settings import AlertsSettings, Settings
from tests.support.alerts import make_alert

T0 = 1_800_000_000.0  # the clock's start, seconds


@dataclass
class Clock:
    """Seconds that move only when the test says."""

    now: float = T0

    def __call__(self) -> float:
        return self.now


@dataclass
class Record:
    """An alert-topic record as the consumer hands it over (what :meth:`Dispatcher.apply` reads)."""

    topic_name: str
    payload: bytes
    record_key: bytes
    offset_: int

    def topic(self) -> str:
        return self.topic_name

    def value(self) -> bytes:
        return self.payload

    def key(self) -> bytes:
        return self.record_key

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self.offset_


@pytest.fixture
def offline(base_settings: Settings) -> Settings:
    """Settings whose Kafka nobody listens on (nothing here may reach it) and no InfluxDB."""
    return base_settings.with_endpoints(kafka="127.0.0.1:1", influx="")


def dispatcher(settings: Settings, tmp_path: Path, urls: dict[str, str], clock: Clock, **route: Any) -> Dispatcher:
    tree = parse_routing(
        {
            "receivers": {name: {"url": url} for name, url in urls.items()},
            "route": {"receiver": next(iter(urls)), "group_by": ["site", "rule"], **route},
        }
    )
    config = AlertsSettings(state_dir=tmp_path, retry_initial_s=10.0, retry_max_s=10.0, retry_after_max_s=60.0)
    return Dispatcher(settings, config, tree, threading.Event(), clock=clock)


def feed(forwarder: Dispatcher, alerts: list[AlertRecord]) -> None:
    for offset, alert in enumerate(alerts):
        key, value, _ = alert_message(alert)
        forwarder.apply(Record(forwarder.settings.topics.alerts, value, key, offset))


def posted(hook: Any) -> list[tuple[int, set[str]]]:
    """Each post the receiver got: its status and the alert ids it listed."""
    return [(status, {a["alert_id"] for a in body["alerts"]}) for _, status, body in hook.requests]


def alert(device: str, site: str, rule: str = "anomaly_score") -> AlertRecord:
    return make_alert(device, "smart_meter", site, rule, "warning", "raised", int(T0 * 1000) - 60_000)


def test_a_burst_is_one_post_after_group_wait_and_each_group_is_its_own(
    offline: Settings, tmp_path: Path, webhook: Any
) -> None:
    hook, url = webhook(fail_every=1, retry_after_at=None, stall_at=None)  # 503 to every post: never recorded
    clock = Clock()
    forwarder = dispatcher(offline, tmp_path, {"oncall": url}, clock, group_wait="30s")
    burst = [alert(f"meter-{n}", "home-1") for n in range(5)]
    other = alert("meter-9", "home-2")
    feed(forwarder, [*burst, other])
    forwarder.evaluate()
    clock.now += 29.999
    forwarder.evaluate()
    assert hook.requests == []  # the burst waits group_wait from its first alert
    clock.now = T0 + 30
    forwarder.evaluate()
    assert sorted(posted(hook), key=lambda post: len(post[1])) == [
        (503, {other.alert_id}),
        (503, {a.alert_id for a in burst}),
    ]


def test_a_failed_post_is_tried_again_after_the_back_off_on_the_clock(
    offline: Settings, tmp_path: Path, webhook: Any
) -> None:
    hook, url = webhook(fail_every=1, retry_after_at=None, stall_at=None)
    clock = Clock()
    forwarder = dispatcher(offline, tmp_path, {"oncall": url}, clock, group_wait="0s")
    feed(forwarder, [alert("meter-1", "home-1")])
    forwarder.evaluate()
    assert len(hook.requests) == 1
    # the first retry waits between half and all of retry_initial_s (10 s, with jitter)
    clock.now += 4.999
    forwarder.evaluate()
    assert len(hook.requests) == 1
    clock.now = T0 + 10.0
    forwarder.evaluate()
    assert len(hook.requests) == 2
    assert forwarder.counts["retries"] == 2 and forwarder.failures == {"http_503": 2}
    keys = {key for key, _, _ in hook.requests}
    assert len(keys) == 1  # a retry is the same notification: the receiver deduplicates by its key


def test_retry_after_sets_the_next_try_and_a_failing_receiver_holds_up_nobody(
    offline: Settings, tmp_path: Path, webhook: Any
) -> None:
    slow, slow_url = webhook(fail_every=2, retry_after_at=1, stall_at=None)  # 429 Retry-After: 1, then 503
    down, down_url = webhook(fail_every=1, retry_after_at=None, stall_at=None)
    clock = Clock()
    forwarder = dispatcher(
        offline,
        tmp_path,
        {"slow": slow_url, "down": down_url},
        clock,
        group_wait="0s",
        routes=[{"match": {"site": "home-2"}, "receiver": "down"}],
    )
    feed(forwarder, [alert("meter-1", "home-1"), alert("meter-2", "home-2")])
    forwarder.evaluate()
    assert [s for _, s, _ in slow.requests] == [429] and [s for _, s, _ in down.requests] == [503]
    clock.now += 0.999
    forwarder.evaluate()
    assert len(slow.requests) == 1  # not before the second the receiver asked for
    clock.now = T0 + 1.0
    started = time.monotonic()
    forwarder.evaluate()
    assert len(slow.requests) == 2 and len(down.requests) == 1  # the other receiver's back-off is its own
    assert time.monotonic() - started < 5  # no wait: the clock, not the test, moved
