"""``iotwatch alerts tail``: watch the alert topic, for people or scripts.

A viewer by default (every partition, no consumer group, nothing committed: everyone tailing
sees every alert); ``--group`` makes it a group member that commits and resumes
(docs/operate/oncall.md, "Following alerts").
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from iotwatch.alerts.records import AlertFilter, headline, human_age
from iotwatch.clients.kafka import (
    FOLLOW_FETCH_WAIT_MS,
    TopicFollower,
    access_refused,
    client_config,
    raise_if_refused,
    topic_partitions,
)
from iotwatch.contract.alerts import SEVERITIES, AlertRecord, BadAlert, decode_alert, encode_alert
from iotwatch.settings import AlertsSettings, Settings

log = logging.getLogger(__name__)

SEVERITY_STYLE = {"critical": "bold white on red", "major": "bold red", "minor": "yellow", "warning": "cyan"}


def group_consumer(settings: Settings, alerts: AlertsSettings, group_id: str, from_beginning: bool) -> Consumer:
    """A consumer of the alert topic in ``group_id``; offsets are stored by the caller after
    handling, and committed automatically."""
    # fails fast, in one line, when Kafka is down or refuses this user the topic
    partitions = topic_partitions(settings.kafka, [settings.topics.alerts], "READ")
    if not partitions[settings.topics.alerts]:
        log.warning("topic %s does not exist yet; waiting for the streaming job to create it", settings.topics.alerts)
    consumer = Consumer(
        {
            **client_config(settings.kafka),
            "group.id": group_id,
            "auto.offset.reset": "earliest" if from_beginning else "latest",
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            "session.timeout.ms": alerts.session_timeout_ms,
            "max.poll.interval.ms": max(alerts.max_poll_interval_ms, alerts.session_timeout_ms),
            "heartbeat.interval.ms": max(500, alerts.session_timeout_ms // 5),
            "client.id": f"iotwatch-alerts-{group_id}",
            "fetch.wait.max.ms": FOLLOW_FETCH_WAIT_MS,
        }
    )
    consumer.subscribe([settings.topics.alerts])
    return consumer


def viewer(settings: Settings, stop: threading.Event, since_ms: int | None = None) -> TopicFollower:
    """A follower of every partition of the alert topic from ``since_ms`` (None: its beginning),
    in no group (nothing committed); waits for the topic when the streaming job has not created
    it yet."""
    topic = settings.topics.alerts

    def count() -> int:  # fails fast, in one line, when Kafka is down or refuses this user the topic
        return topic_partitions(settings.kafka, [topic], "READ")[topic]

    if not count():
        log.warning("topic %s does not exist yet; waiting for the streaming job to create it", topic)
        while not count() and not stop.wait(1.0):
            pass
    return TopicFollower(settings.kafka, [topic], since_ms)


#: Event time is shown beside the detection time when the two are further apart than this
#: (a device clock off, a backlog, or a simulator's --speedup moving event time).
EVENT_TIME_SHOWN_AFTER_MS = 60_000


def age_s(at_ms: int, now_ms: float) -> float:
    return (now_ms - at_ms) / 1000


def event_time_if_apart(alert: AlertRecord) -> str:
    """The episode's first event time (ISO 8601 UTC) when it is far from the detection time, else ''."""
    apart = abs(alert.detected_at_ms - alert.first_event_ms) > EVENT_TIME_SHOWN_AFTER_MS
    return alert.first_event_time if apart else ""


def _detail(alert: AlertRecord) -> str:
    """The message without the ``[SEV] rule raised on X at Y:`` prefix the other columns repeat."""
    message = headline(alert)
    return message.split(": ", 1)[1] if ": " in message and message.startswith("[") else message


@dataclass
class TailView:
    """Latest record per alert_id (a clear replaces its raise), newest first, ages recomputed on render."""

    title: str
    max_rows: int = 30
    rows: OrderedDict[str, AlertRecord] = field(default_factory=OrderedDict)
    shown: int = 0
    filtered: int = 0
    malformed: int = 0

    def add(self, alert: AlertRecord) -> None:
        self.rows.pop(alert.alert_id, None)
        self.rows[alert.alert_id] = alert
        while len(self.rows) > self.max_rows:
            self.rows.popitem(last=False)

    def render(self) -> Group:
        now_ms = time.time() * 1000
        open_by_sev = {s: 0 for s in SEVERITIES}
        for alert in self.rows.values():
            if alert.raised:
                open_by_sev[alert.severity] += 1
        summary = Text(f"{self.title}  ")
        for sev, count in open_by_sev.items():
            summary.append(f" {sev} {count} ", style=SEVERITY_STYLE[sev] if count else "dim")
        summary.append(
            f"  open of last {len(self.rows)} · {self.shown} shown, {self.filtered} filtered"
            + (f", {self.malformed} malformed" if self.malformed else ""),
            style="dim",
        )
        table = Table(expand=True, pad_edge=False, show_lines=False)
        for name, kwargs in (
            ("sev", {"no_wrap": True}),
            ("state", {"no_wrap": True}),
            ("age", {"justify": "right", "no_wrap": True}),
            ("event time", {"no_wrap": True}),
            ("device", {}),
            ("type", {}),
            ("site", {}),
            ("rule", {}),
            ("message", {"ratio": 1}),
        ):
            table.add_column(name, **kwargs)
        # open alerts first, most severe first, newest first within a severity
        for alert in sorted(reversed(self.rows.values()), key=lambda a: (not a.raised, a.severity_rank)):
            table.add_row(*_cells(alert, now_ms))
        return Group(summary, table)


def _cells(alert: AlertRecord, now_ms: float) -> list[Text | str]:
    cleared = not alert.raised
    sev_style = "dim" if cleared else SEVERITY_STYLE.get(alert.severity, "")
    return [
        Text(alert.severity.upper(), style=sev_style),
        Text(alert.state, style="green" if cleared else "bold"),
        human_age(age_s(alert.detected_at_ms, now_ms)),
        Text(event_time_if_apart(alert), style="dim"),
        alert.device_id,
        alert.device_type,
        alert.site,
        alert.rule,
        Text(_detail(alert), style="dim" if cleared else ""),
    ]


def line(alert: AlertRecord, now_ms: float | None = None) -> Text:
    """One coloured line per alert, for a terminal that is not interactive or ``--plain``: the
    clock time of detection (ISO 8601 UTC) first, for logs read later; the age since detection
    only when the alert is shown late (an alert printed as it arrives is as old as the line), the
    event time only when it is far from the detection time."""
    now = now_ms if now_ms is not None else time.time() * 1000
    cells = _cells(alert, now)
    late = age_s(alert.detected_at_ms, now) >= 2
    out = Text(f"{alert.detected_at} ")
    for i, cell in enumerate(cells):
        text = cell.plain if isinstance(cell, Text) else cell
        if i == 2 and not late or i == 3 and not text:
            continue
        label = ("", "", "age ", "event time ", "", "", "", "", "")[i]
        out.append(label + text + " ", style=cell.style if isinstance(cell, Text) else "")
    return out


@dataclass
class TailOptions:
    group_id: str | None = None  # None: a viewer of every partition, in no group
    from_beginning: bool = False
    since_s: float | None = None  # a viewer starts at alerts detected this many seconds ago
    alert_filter: AlertFilter = field(default_factory=AlertFilter)
    as_json: bool = False
    limit: int | None = None
    timeout_s: float | None = None
    live: bool = True
    max_rows: int = 30


#: Alerts of a backlog held at most, to be shown in time order (then shown, and more read).
BACKLOG_MAX = 100_000

#: Longest a viewer holds the backlog back to sort it, waiting for every partition's end: a
#: partition that does not report its end in time (a broker slow to answer) is shown as it
#: comes, in offset order.
BACKLOG_WAIT_S = 5.0


def run_tail(
    settings: Settings, alerts: AlertsSettings, options: TailOptions, stop: threading.Event, out: TextIO | None = None
) -> dict[str, int]:
    """Consume and show alerts until ``stop``, ``limit`` shown alerts or ``timeout_s``; returns counts."""
    out = out if out is not None else sys.stdout
    source: TopicFollower | Consumer
    if options.group_id is not None:
        source = group_consumer(settings, alerts, options.group_id, options.from_beginning)
        where = f"group {options.group_id}"
    else:
        source = viewer(settings, stop, _since_ms(options))
        where = f"{len(source.partitions)} partition(s), no group"
    log.info(
        "alerts tail: following %s on Kafka %s (%s), from %s",
        settings.topics.alerts,
        settings.kafka.bootstrap_servers,
        where,
        _start_words(options),
    )
    view = TailView(f"{settings.topics.alerts} · {where}", options.max_rows)
    console = Console(file=out, highlight=False, soft_wrap=not options.live)
    deadline = time.monotonic() + options.timeout_s if options.timeout_s is not None else None
    live = (
        Live(get_renderable=view.render, console=console, refresh_per_second=1, transient=False)
        if options.live and not options.as_json
        else None
    )

    def wait_s() -> float:
        """How long the next poll may wait: none once stopped, past the deadline or at the limit."""
        if stop.is_set() or (options.limit is not None and view.shown >= options.limit):
            return 0
        return min(0.5, deadline - time.monotonic()) if deadline is not None else 0.5

    def show(messages: list[Message]) -> None:
        for message in messages:
            if options.limit is not None and view.shown >= options.limit:
                return
            _handle(message, view, options, console, out)

    try:
        if live is not None:
            live.start()
        if isinstance(source, TopicFollower):
            _view(source, options, wait_s, show)
        else:
            _member(settings, source, options.group_id, wait_s, show)
    finally:
        if live is not None:
            live.stop()
        source.close()
    return {"shown": view.shown, "filtered": view.filtered, "malformed": view.malformed}


def _member(
    settings: Settings,
    consumer: Consumer,
    group_id: str | None,
    wait_s: Callable[[], float],
    show: Callable[[list[Message]], None],
) -> None:
    """A group member: each alert's offset is stored once shown, and committed."""
    try:
        while (timeout := wait_s()) > 0:
            message = consumer.poll(timeout)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                _check_error(settings, group_id, error, message.topic())
                continue
            show([message])
            consumer.store_offsets(message=message)
    finally:
        _commit_positions(consumer)


def _view(
    follower: TopicFollower, options: TailOptions, wait_s: Callable[[], float], show: Callable[[list[Message]], None]
) -> None:
    """A viewer: what the topic holds from the start time (now, its beginning or ``--since``
    ago; the follower starts there) in time order across partitions (Kafka timestamp, then
    partition and offset), up to :data:`BACKLOG_MAX` at a time; then new alerts as they come."""
    held: list[Message] = []
    for batch in follower.batches(BACKLOG_WAIT_S, strict=False):
        held += batch
        if len(held) >= BACKLOG_MAX:
            show(sorted(held, key=_in_time_order))
            held = []
        if wait_s() <= 0:
            break
    show(sorted(held, key=_in_time_order))
    while (timeout := wait_s()) > 0:
        show(follower.poll(timeout))


def _since_ms(options: TailOptions) -> int | None:
    """Where a viewer starts: None (the beginning) or a Kafka timestamp."""
    if options.from_beginning:
        return None
    return int(time.time() * 1000) - int((options.since_s or 0) * 1000)


def _in_time_order(message: Message) -> tuple[int, int, int]:
    return message.timestamp()[1], message.partition() or 0, message.offset() or 0


def _start_words(options: TailOptions) -> str:
    if options.group_id is not None:
        otherwise = "the oldest alert" if options.from_beginning else "now"
        return f"the group's committed offsets (else {otherwise})"
    if options.since_s is not None:
        return f"alerts detected in the last {human_age(options.since_s)}"
    return "the oldest retained alert" if options.from_beginning else "now (new alerts only)"


def _handle(message: Message, view: TailView, options: TailOptions, console: Console, out: TextIO) -> None:
    try:
        alert = decode_alert(message.value())
    except BadAlert as exc:
        view.malformed += 1
        log.warning(
            "skipping malformed record at %s[%d]@%d: %s", message.topic(), message.partition(), message.offset(), exc
        )
        return
    if not options.alert_filter.matches(alert):
        view.filtered += 1
        return
    view.shown += 1
    if options.as_json:
        out.write(encode_alert(alert).decode() + "\n")
        out.flush()
    elif options.live:
        view.add(alert)
    else:
        console.print(line(alert))


def _commit_positions(consumer: Consumer) -> None:
    """Commit where this run stands on every assigned partition, quiet ones included, so the next
    run resumes there instead of at the then-latest offset of a partition it never committed."""
    try:
        positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
        if positions:
            consumer.commit(offsets=positions, asynchronous=False)
    except KafkaException as exc:
        log.warning("could not commit the tail's position: %s", exc)


def _check_error(settings: Settings, group_id: str | None, error: KafkaError, topic: str | None) -> None:
    """Log a consumer error; a refusal by the broker's ACLs ends the tail in one line."""
    raise_if_refused(settings.kafka, error, "READ", topic or settings.topics.alerts)
    if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        raise access_refused(settings.kafka, "READ", f"consumer group {group_id}")
    if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        log.debug("alert topic not there yet: %s", error)
    else:
        log.warning("Kafka: %s", error)


__all__ = ["TailOptions", "TailView", "group_consumer", "line", "run_tail", "viewer"]
