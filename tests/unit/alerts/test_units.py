"""Pure logic of the on-call tools: filters, text, retry policy, one post (no broker)."""

from __future__ import annotations

import random
import time
from email.utils import formatdate

from rich.console import Console

from iotwatch.alerts.notification import record_body, record_key
from iotwatch.alerts.records import AlertFilter, human_age, slack_text
from iotwatch.alerts.tail import TailView, line
from iotwatch.alerts.webhook import Backoff, Webhook, parse_retry_after
from iotwatch.contract.alerts import alert_as_dict
from tests.support.alerts import changed, make_alert

CRASH = make_alert("car-1", "vehicle_edr", "fleet-2", "crash", "critical", "raised", 1_700_000_000_000)


def test_filter_minimum_severity_and_allow_lists() -> None:
    minor = changed(CRASH, severity="minor", site="home-1")
    assert AlertFilter.of("major").matches(CRASH) and not AlertFilter.of("major").matches(minor)
    assert AlertFilter.of("warning").matches(minor)
    assert AlertFilter.of(site=["home-1"]).matches(minor) and not AlertFilter.of(site=["home-1"]).matches(CRASH)
    assert AlertFilter.of(device_type=["vehicle_edr"], rule=["crash"], state=["raised"]).matches(CRASH)
    assert not AlertFilter.of(rule=["anomaly"]).matches(CRASH)
    assert not AlertFilter.of(state=["cleared"]).matches(CRASH)


def test_slack_text_and_payload() -> None:
    assert slack_text(CRASH) == ":red_circle: [CRITICAL] crash raised on vehicle_edr car-1 at fleet-2: value 31.5"
    cleared = changed(CRASH, state="cleared", message="")
    assert slack_text(cleared) == ":large_green_circle: [CRITICAL] crash cleared on vehicle_edr car-1 at fleet-2"
    body = record_body(CRASH)
    assert body["text"].startswith(":red_circle:") and {k: v for k, v in body.items() if k != "text"} == alert_as_dict(
        CRASH
    )


def test_retry_after_and_backoff_are_bounded() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert 8 <= parse_retry_after(formatdate(time.time() + 10, usegmt=True)) <= 10  # type: ignore[operator]
    backoff = Backoff(0.5, 8.0, rng=random.Random(1))
    delays = [backoff.delay(n) for n in range(1, 30)]
    assert 0.25 <= delays[0] <= 0.5 and all(d <= 8.0 for d in delays) and max(delays) >= 4.0
    assert len({round(d, 6) for d in delays}) > 20  # jittered


def test_human_age() -> None:
    assert [human_age(s) for s in (5, 65, 3700, 90000)] == ["5s", "1m05s", "1h01m", "1d01h"]


def test_a_post_is_delivered_retried_or_refused_by_the_answer(webhook) -> None:  # type: ignore[no-untyped-def]
    hook, url = webhook(fail_every=2, retry_after_at=3, stall_at=4, stall_s=0.6)
    client = Webhook(url, timeout_s=0.3)
    # requests: 1 ok, 2 503, 3 429 Retry-After 1, 4 stalls past the timeout, 5 ok
    results = [client.send(record_body(CRASH), record_key(CRASH), attempt) for attempt in range(1, 6)]
    assert [(r.outcome, r.reason) for r in results] == [
        ("delivered", "http_200"),
        ("retry", "http_503"),
        ("retry", "http_429"),
        ("retry", "timeout"),
        ("delivered", "http_200"),
    ]
    assert results[2].retry_after_s == 1.0 and results[1].retry_after_s is None
    assert {k for k, _, _ in hook.requests} == {f"{CRASH.alert_id}:raised"}
    hook.reject.add(CRASH.alert_id)
    refused = client.send(record_body(CRASH), record_key(CRASH))
    assert (refused.outcome, refused.reason) == ("permanent", "http_400")


def test_table_and_line_render() -> None:
    view = TailView("t", max_rows=2)
    now = time.time() * 1000
    for i in range(3):
        view.add(changed(CRASH, alert_id=f"x{i}", first_event_ms=int(now - 125_000), detected_at_ms=int(now - 5_000)))
    view.add(changed(CRASH, alert_id="x2", state="cleared"))
    assert list(view.rows) == ["x1", "x2"]
    console = Console(record=True, width=160)
    console.print(view.render())
    text = console.export_text()
    assert "car-1" in text and "fleet-2" in text and "cleared" in text
    assert "critical 1" in text  # one still open
    shown = view.rows["x1"]
    assert " 5s " in text and shown.first_event_time in text  # age since detection; the event time 2 min before it
    detected = int(now)
    fresh = changed(CRASH, first_event_ms=detected - 3_000, detected_at_ms=detected)
    at_once = line(fresh, now_ms=detected + 500).plain  # printed as it arrives: no age, no event time
    assert at_once.startswith(f"{fresh.detected_at} CRITICAL raised car-1") and "age" not in at_once, at_once
    assert "CRITICAL raised age 42s" in line(fresh, now_ms=detected + 42_000).plain  # shown late
    apart = changed(CRASH, first_event_ms=detected - 3_600_000, detected_at_ms=detected)
    assert f"event time {apart.first_event_time} " in line(apart, now_ms=detected).plain
    assert "value 31.5" in at_once


def test_receiver_name_keeps_scheme_host_port_and_first_path_segment_only() -> None:
    from iotwatch.alerts.webhook import receiver_name

    assert receiver_name("https://hooks.slack.com/services/T0/B0/XXXX") == "https://hooks.slack.com/services/…"
    assert receiver_name("https://user:pw@example.org:8443/hook?token=abc") == "https://example.org:8443/hook/…"
    assert receiver_name("http://[::1]:9000") == "http://[::1]:9000"
    assert receiver_name("http://example.org/alerts") == "http://example.org/alerts"


def test_on_call_metrics_wait_for_the_next_snapshot_after_a_failed_write_and_stay_bounded(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An InfluxDB that refuses connections (nothing listens on the port): one failed write per
    snapshot interval, not one per forwarder tick, and at most MAX_PENDING points kept."""
    import iotwatch.alerts.metrics
    from iotwatch.alerts.book import AlertBook
    from iotwatch.alerts.metrics import LifecycleMetrics
    from iotwatch.application.stack.process import free_port
    from iotwatch.clients.influx import InfluxV1Client
    from iotwatch.settings import InfluxSettings

    metrics = LifecycleMetrics(InfluxV1Client(InfluxSettings(url=f"http://127.0.0.1:{free_port()}")), interval_s=10)
    book = AlertBook()
    book.apply_alert(CRASH)
    book.apply_alert(changed(CRASH, state="cleared"))
    book.apply_alert(changed(CRASH, alert_id="still-firing"))  # a snapshot point per interval
    metrics.observe(book.alerts[CRASH.alert_id])
    now = 1_700_000_000_000
    metrics.flush(book, now)
    assert metrics.failures == 1 and metrics.pending
    for tick in range(1, 40):  # the forwarder's 0.2 s ticks within the interval
        metrics.flush(book, now + tick * 200)
    assert metrics.failures == 1
    metrics.flush(book, now + 10_000)
    assert metrics.failures == 2
    monkeypatch.setattr(iotwatch.alerts.metrics, "MAX_PENDING", 3)
    for n in range(5):
        metrics.flush(book, now + 20_000 + n * 10_000)  # a snapshot point each
    assert len(metrics.pending) == 3 and metrics.dropped >= 2


def test_a_short_alert_id_asks_for_six_characters_a_long_unknown_one_is_unknown() -> None:
    """``alerts ack f0a``: too short to pick an alert, whether one starts with it or not."""
    import pytest

    from iotwatch.alerts.book import MIN_PREFIX, AlertBook, UnknownAlert

    book = AlertBook()
    book.apply_alert(CRASH)
    with pytest.raises(UnknownAlert, match=f"too short: give at least {MIN_PREFIX} characters"):
        book.find(CRASH.alert_id[:3])
    assert book.find(CRASH.alert_id[:MIN_PREFIX]).alert_id == CRASH.alert_id
    with pytest.raises(UnknownAlert, match="no alert with id 'ffffffffff'"):
        book.find("ffffffffff")


def test_on_call_metrics_say_once_when_influxdb_is_lost_and_once_when_it_is_back(caplog) -> None:  # type: ignore[no-untyped-def]
    """``alerts forward`` with no InfluxDB: one short line, not a urllib3 warning every 10 s;
    one line when writes succeed again (an HTTP server answering InfluxDB's 204)."""
    import logging
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from iotwatch.alerts.book import AlertBook
    from iotwatch.alerts.metrics import LifecycleMetrics
    from iotwatch.application.stack.process import free_port
    from iotwatch.clients.influx import InfluxV1Client
    from iotwatch.settings import InfluxSettings

    class Influx(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    port = free_port()
    metrics = LifecycleMetrics(InfluxV1Client(InfluxSettings(url=f"http://127.0.0.1:{port}")), interval_s=10)
    book = AlertBook()
    book.apply_alert(CRASH)
    now = 1_700_000_000_000
    with caplog.at_level(logging.DEBUG, logger="iotwatch.alerts.metrics"):
        for n in range(6):  # a minute without InfluxDB
            metrics.flush(book, now + n * 10_000)
        server = ThreadingHTTPServer(("127.0.0.1", port), Influx)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            metrics.flush(book, now + 60_000)
            metrics.flush(book, now + 70_000)
        finally:
            server.shutdown()
            server.server_close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(
        f"InfluxDB lost: InfluxDB write to http://127.0.0.1:{port} failed (connection refused)"
    )
    assert "urllib3" not in warnings[0] and "HTTPConnectionPool" not in warnings[0]
    assert warnings[1].startswith("InfluxDB back: ")
    assert metrics.failures == 6 and not metrics.pending
