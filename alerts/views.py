"""Tables of ``alerts list`` and ``alerts silences`` (rich, plain when stdout is not a terminal)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from iotwatch.alerts.book import ACKNOWLEDGED, OPEN, AlertBook, AlertView
from iotwatch.alerts.records import human_age
from iotwatch.alerts.tail import SEVERITY_STYLE
from iotwatch.cli import output_console
from iotwatch.contract.oncall import Silence

STATUS_STYLE = {OPEN: "bold red", ACKNOWLEDGED: "yellow"}


console = output_console


def shown_of(shown: int, total: int, noun: str, order: str) -> str:
    """The footer of a list: what it shows of what there is, and how to see the rest.

    >>> shown_of(50, 2350, "alerts", "newest first")
    '50 of 2,350 alerts (newest first; --limit N or --all)'
    >>> shown_of(3, 3, "alerts", "newest first")
    '3 alerts (newest first)'
    >>> shown_of(1, 1, "dead letters", "newest first")
    '1 dead letter (newest first)'
    """
    noun = noun.removesuffix("s") if total == 1 else noun
    if shown < total:
        return f"{shown:,} of {total:,} {noun} ({order}; --limit N or --all)"
    return f"{total:,} {noun} ({order})"


def alerts_table(views: Sequence[AlertView], book: AlertBook, total: int) -> None:
    now = int(time.time() * 1000)
    table = Table(pad_edge=False, box=None, header_style="bold")
    for name in ("id", "status", "sev", "rule", "device", "site", "age", "acknowledged", "silenced"):
        table.add_column(name, no_wrap=name != "acknowledged")
    for view in views:
        record = view.record
        severity = str(record.severity)
        raised = view.raised_ms
        ack = view.acknowledgement
        silence = book.silence_for(record, now) if view.firing else None
        table.add_row(
            view.alert_id[:12],
            Text(view.status, style=STATUS_STYLE.get(view.status, "dim")),
            Text(severity.upper(), style=SEVERITY_STYLE.get(severity, "") if view.firing else "dim"),
            record.rule,
            record.device_id,
            record.site,
            human_age((now - raised) / 1000) if raised else "-",
            f"{ack.by} {human_age((now - ack.at_ms) / 1000)} ago" + (f": {ack.note}" if ack.note else "")
            if ack
            else "-",
            silence.silence_id if silence else "-",
        )
    out = console()
    out.print(table)
    out.print(shown_of(len(views), total, "alerts", "open first, most severe first, newest first"), style="dim")


def silences_table(silences: Sequence[Silence], now_ms: int, ended_too: bool) -> None:
    table = Table(pad_edge=False, box=None, header_style="bold")
    for name in ("id", "matchers", "ends", "by", "comment"):
        table.add_column(name)
    for item in silences:
        left = (item.ends_at_ms - now_ms) / 1000
        ends = (
            f"in {human_age(left)}"
            if left > 0
            else (f"revoked by {item.revoked_by}" if item.revoked_by else f"{human_age(-left)} ago")
        )
        table.add_row(item.silence_id, item.matchers.describe(), ends, item.created_by, item.comment or "")
    out = console()
    out.print(table)
    which = "active and ended, newest first" if ended_too else "active, newest first; --all for ended ones"
    out.print(shown_of(len(silences), len(silences), "silences", which), style="dim")
