"""The long-running on-call services keep only what is open: after waves of alerts that fire
and clear, the forwarder holds the open alerts, their groups and the active silences (cleared
alerts go once their resolution was sent; with a record receiver, once their records were
posted), and the responder the open alerts and unsettled commands.
Against the real Apache Kafka broker, MQTT broker and a real HTTP receiver."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from iotwatch.alerts.actions import add_silence
from iotwatch.alerts.dispatch import Dispatcher
from iotwatch.alerts.routing import parse_routing, single_receiver
from iotwatch.clients.kafka import ensure_topics
from iotwatch.contract.oncall import ONCALL_SCHEMA_VERSION, CommandAudit, CommandOutcome, Matchers, encode
from iotwatch.responder.service import Responder
from iotwatch.settings import AlertsSettings, Settings
from tests.helpers import InThread, wait_for
from tests.support.alerts import changed, make_alert, produce

SITES, PER_SITE, OPEN = 40, 10, 3


def wave(n: int, start_ms: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``SITES * PER_SITE`` raised alerts of wave ``n`` and the clears of all but the first ``OPEN``."""
    raised = [
        make_alert(f"w{n}-d{s}-{i}", "thermostat", f"site-{s}", "stuck_hvac", "major", "raised", start_ms + i)
        for s in range(SITES)
        for i in range(PER_SITE)
    ]
    cleared = [changed(a, state="cleared", detected_at_ms=int(time.time() * 1000)) for a in raised[OPEN:]]
    return raised, cleared


def test_forwarder_memory_holds_only_open_alerts_and_recent_groups(
    test_settings: Settings, tmp_path: Path, webhook: Any
) -> None:
    hook, url = webhook(fail_every=0, retry_after_at=None, stall_at=None)
    tree = parse_routing(
        {
            "receivers": {"oncall": {"url": url}},
            "route": {"receiver": "oncall", "group_by": ["site"], "group_wait": "0s", "group_interval": "1s"},
        }
    )
    config = AlertsSettings(state_dir=tmp_path, forget_after_s=0)
    add_silence(test_settings, Matchers(site="site-0"), 0.5, "carol", "expires at once")
    start = int(time.time() * 1000) - 60_000
    running = InThread(lambda stop: Dispatcher(test_settings, config, tree, stop))
    dispatcher: Dispatcher = running.service
    try:
        for n in range(2):
            raised, cleared = wave(n, start + n * 10_000)
            produce(test_settings.kafka, test_settings.topics.alerts, raised)
            wait_for(
                lambda raised=raised, n=n: (
                    len(
                        {
                            a
                            for _, s, b in hook.requests
                            if s == 200 and b["status"] == "firing"
                            for a in (x["alert_id"] for x in b["alerts"])
                        }
                    )
                    >= len(raised) * (n + 1)
                ),
                60,
                f"wave {n} notified",
            )
            produce(test_settings.kafka, test_settings.topics.alerts, cleared)
            wait_for(
                lambda cleared=cleared, n=n: dispatcher.counts["forgotten_alerts"] >= len(cleared) * (n + 1),
                60,
                f"wave {n}'s cleared alerts resolved and forgotten",
            )
        # two waves of 400 alerts went through; what is left is what is open
        open_ids = {a.alert_id for n in range(2) for a in wave(n, start + n * 10_000)[0][:OPEN]}
        assert set(dispatcher.book.alerts) == open_ids
        assert len(dispatcher.groups) == 1 and len(dispatcher.sent) == 1  # site-0 holds all the open ones
        assert dispatcher.book.silences == {}  # the expired silence is gone too
        assert dispatcher.counts["sent_resolved"] >= SITES
    finally:
        running.close()


def test_a_record_receivers_forwarder_holds_only_open_alerts(
    test_settings: Settings, tmp_path: Path, webhook: Any
) -> None:
    """``alerts forward --webhook``: once every record is delivered and the cleared alerts'
    time is up, the book and what the receiver was sent hold the open alerts; nothing waits."""
    hook, url = webhook(fail_every=0, retry_after_at=None, stall_at=None)
    raised, cleared = wave(0, int(time.time() * 1000) - 60_000)
    produce(test_settings.kafka, test_settings.topics.alerts, raised + cleared)
    config = AlertsSettings(state_dir=tmp_path, forget_after_s=0)
    running = InThread(lambda stop: Dispatcher(test_settings, config, single_receiver(url), stop))
    dispatcher: Dispatcher = running.service
    try:
        wait_for(lambda: len(hook.delivered) == len(raised) + len(cleared), 60, "every record delivered")
        wait_for(lambda: dispatcher.counts["forgotten_alerts"] >= len(cleared), 30, "cleared alerts forgotten")
        open_ids = {a.alert_id for a in raised[:OPEN]}
        assert dispatcher.feed is not None and dispatcher.feed.waiting() == 0
        assert set(dispatcher.book.alerts) == open_ids
        assert dispatcher.groups == {} and dispatcher.sent == {}
    finally:
        running.close()


def test_responder_memory_holds_only_open_alerts_and_unsettled_commands(test_settings: Settings, unique: str) -> None:
    settings = test_settings.model_copy(
        update={
            "respond": test_settings.respond.model_copy(
                update={"client_id": f"responder-{unique}", "forget_after_s": 0}
            )
        }
    )
    start = int(time.time() * 1000) - 60_000
    raised, cleared = wave(0, start)
    produce(settings.kafka, settings.topics.alerts, raised + cleared)
    now = int(time.time() * 1000)
    done = [raised[-1], raised[-2]]  # cleared alerts whose commands are final
    waiting = raised[-3]  # cleared, its command still unanswered and not expired: kept until it settles
    audits = [
        CommandAudit(
            ONCALL_SCHEMA_VERSION,
            f"c-{i}",
            "reset-stuck-hvac",
            a.alert_id,
            "stuck_hvac",
            a.device_id,
            "thermostat",
            a.site,
            "reset_hvac",
            "responder",
            now - 5000,
            now + 600_000,
            1,
            CommandOutcome.SENT,
        ).with_step(CommandOutcome.SENT, now - 5000)
        for i, a in enumerate([*done, waiting])
    ]
    audits = [a.with_step(CommandOutcome.DONE, now - 4000) if a.alert_id != waiting.alert_id else a for a in audits]
    ensure_topics(settings.kafka, [settings.topics.commands], compacted=True)
    producer = Producer(settings.kafka.client_config())
    for audit in audits:
        producer.produce(settings.topics.commands, encode(audit), key=audit.command_id.encode())
    assert producer.flush(30) == 0

    running = InThread(lambda stop: Responder(settings, (), stop))
    responder: Responder = running.service
    try:
        wait_for(lambda: responder.counts["forgotten_alerts"] == len(cleared) - 1, 30, "cleared alerts forgotten")
        assert set(responder.book.alerts) == {a.alert_id for a in raised[:OPEN]} | {waiting.alert_id}
        assert set(responder.audits) == {"c-2"} and list(responder.latest) == [(waiting.alert_id, "reset-stuck-hvac")]
    finally:
        running.close()
