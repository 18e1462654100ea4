"""``iotwatch alerts``: the on-call commands (tail, forward, list, ack, silence, silences, unsilence)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import msgspec

from iotwatch.cli import AppContext, F, compose, emit, endpoint_options, json_option, pass_app, stop_on_signals
from iotwatch.contract.alerts import SEVERITIES, STATES
from iotwatch.settings import AlertsSettings


def _positive_duration(text: str, option: str) -> float:
    """Seconds from ``30m``, ``2h``...; a usage error naming ``option`` for anything else or zero."""
    from iotwatch.alerts.records import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None
    if seconds <= 0:
        raise click.BadParameter("must be longer than 0", param_hint=option)
    return seconds


def _alerts_settings(app: AppContext, **update: Any) -> AlertsSettings:
    """The ``[alerts]`` settings (``--config`` included) with the options given on the command line."""
    return app.settings.alerts.model_copy(update={k: v for k, v in update.items() if v is not None})


@click.group()
def alerts() -> None:
    """On-call tools: watch, list, acknowledge and silence alerts; forward them to receivers."""


def run_bounds(limit_help: str) -> Callable[[F], F]:
    """--limit and --timeout: both commands must be stoppable by scripts and tests."""
    return compose(
        click.option("--limit", type=click.IntRange(min=1), help=limit_help),
        click.option(
            "--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), help="Stop after this many seconds."
        ),
    )


@alerts.command()
@endpoint_options(kafka=True)
@click.option(
    "--group",
    "group_id",
    help="Read as a member of this consumer group (offsets committed: the next run resumes; members split "
    "the partitions). Without it (and IOTWATCH_ALERTS_TAIL_GROUP_ID unset) the tail reads every partition "
    "in no group, so every viewer sees every alert.",
)
@click.option(
    "--from-beginning",
    is_flag=True,
    help="Start at the oldest retained alert instead of the newest (with --group: only where the "
    "group has committed nothing).",
)
@run_bounds("Stop after showing this many alerts (those passing the filters).")
@click.option(
    "--severity", type=click.Choice(SEVERITIES), help="Minimum severity shown (critical > major > minor > warning)."
)
@click.option("--site", "sites", multiple=True, help="Only this site (repeatable).")
@click.option("--device-type", "device_types", multiple=True, help="Only this device type (repeatable).")
@click.option("--rule", "rules", multiple=True, help="Only this rule (repeatable).")
@click.option("--device", "devices", multiple=True, help="Only this device id (repeatable).")
@click.option("--state", "states", multiple=True, type=click.Choice(STATES), help="Only raised or only cleared.")
@click.option(
    "--since",
    "since",
    metavar="DURATION",
    help="Start at the alerts written in the last DURATION (e.g. 30m, 1h, 2d) instead of now.",
)
@click.option(
    "--plain",
    is_flag=True,
    help="One coloured line per alert, starting with its detection time (ISO 8601 "
    "UTC), instead of the live table (the default when stdout is not a "
    "terminal).",
)
@click.option(
    "--rows", type=click.IntRange(min=1), default=30, show_default=True, help="Alerts kept in the live table."
)
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per matching alert per line, no live table (for scripts)."
)
@pass_app
def tail(
    app: AppContext,
    group_id: str | None,
    from_beginning: bool,
    limit: int | None,
    timeout_s: float | None,
    severity: str | None,
    sites: tuple[str, ...],
    device_types: tuple[str, ...],
    rules: tuple[str, ...],
    devices: tuple[str, ...],
    states: tuple[str, ...],
    since: str | None,
    plain: bool,
    rows: int,
    as_json: bool,
) -> None:
    """Follow the alert topic: a live, colour-coded table of the latest alerts (a clear replaces its raise;
    ages since detection refresh every second).

    A viewer: it reads every partition in no consumer group, so everyone tailing sees every
    alert; it starts now, at the oldest alert (--from-beginning) or --since ago. --group makes it
    a group member that commits its offsets and resumes. --json prints each matching alert as
    one JSON object per line instead, for scripts. Ctrl-C or SIGTERM stops it (exit 0, with its counts).
    """
    from iotwatch.alerts.records import AlertFilter
    from iotwatch.alerts.tail import TailOptions, run_tail

    settings = app.settings
    config = app.settings.alerts
    group = group_id or config.tail_group_id
    since_s = None
    if since is not None:
        since_s = _positive_duration(since, "--since")
        if from_beginning:
            raise click.UsageError("--since and --from-beginning choose the start twice: give one")
        if group is not None:
            raise click.UsageError("--since is for a viewer: a group member resumes at its committed offsets")
    options = TailOptions(
        group_id=group,
        since_s=since_s,
        from_beginning=from_beginning,
        alert_filter=AlertFilter.of(
            severity, site=sites, device_type=device_types, rule=rules, device_id=devices, state=states
        ),
        as_json=as_json,
        limit=limit,
        timeout_s=timeout_s,
        live=not plain and sys.stdout.isatty(),
        max_rows=rows,
    )
    counts = run_tail(settings, config, options, stop_on_signals())
    click.echo(  # on stderr: stdout stays the alerts (JSON lines with --json)
        f"alerts tail: {counts['shown']} shown, {counts['filtered']} filtered, {counts['malformed']} malformed",
        err=True,
    )


@alerts.command()
@endpoint_options(kafka=True)
@click.option(
    "--webhook",
    "webhook_url",
    metavar="URL",
    help="http(s) URL to post every alert record to (default IOTWATCH_ALERTS_WEBHOOK_URL).",
)
@click.option(
    "--group",
    "group_id",
    help="Consumer group in which the forwarder commits how far its record receiver (--webhook) got "
    "(default IOTWATCH_ALERTS_FORWARD_GROUP_ID).",
)
@click.option(  # a delivery pipeline: a new group starts at the oldest alert, so none raised before is skipped
    "--from-latest",
    "from_beginning",
    flag_value=False,
    default=True,
    help="A group with no committed offsets starts at the newest alert instead of the oldest "
    "retained one; otherwise it resumes.",
)
@run_bounds("Stop after handling this many alert records.")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where refused notifications are dead-lettered, dead-notifications.jsonl (default "
    "IOTWATCH_ALERTS_STATE_DIR, ~/.iotwatch/alerts).",
)
@click.option("--dead-letter-topic", help="Also produce refused notifications to this Kafka topic.")
@click.option(
    "--webhook-timeout",
    "webhook_timeout_s",
    type=click.FloatRange(min=0.001),
    help="Seconds one post to --webhook may take (default 10).",
)
@click.option(
    "--retry-max",
    "retry_max_s",
    type=click.FloatRange(min=0.001),
    help="Longest back-off between retries in seconds (default 60).",
)
@click.option(
    "--routes",
    "routes_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Routing file (TOML): receivers and a policy tree, with grouping, silences, repeats and "
    "resolved notifications (default IOTWATCH_ALERTS_ROUTES_FILE). Replaces --webhook.",
)
@json_option
@pass_app
def forward(
    app: AppContext,
    webhook_url: str | None,
    group_id: str | None,
    from_beginning: bool,
    limit: int | None,
    timeout_s: float | None,
    state_dir: Path | None,
    dead_letter_topic: str | None,
    webhook_timeout_s: float | None,
    retry_max_s: float | None,
    routes_file: Path | None,
    as_json: bool,
) -> None:
    """Notify receivers of alerts, at least once: post each raised/cleared alert record as JSON to
    --webhook URL, or follow a policy tree (--routes FILE; iotwatch.alerts.routing documents the
    file). Stop with SIGTERM or Ctrl-C (the post in flight completes and is recorded; exit 0).
    --json prints the counters at exit. docs/operate/oncall.md ("Notifications", "What receivers
    are sent") describes when it sends what, the request format and the delivery guarantees."""
    from iotwatch.alerts.dispatch import Dispatcher, ForwardOptions
    from iotwatch.alerts.routing import load_routing, single_receiver

    config = _alerts_settings(
        app,
        webhook_url=webhook_url,
        state_dir=state_dir,
        dead_letter_topic=dead_letter_topic,
        webhook_timeout_s=webhook_timeout_s,
        retry_max_s=retry_max_s,
        routes_file=routes_file,
    )
    if config.routes_file:
        tree = load_routing(config.routes_file)
    else:
        if not config.webhook_url:
            raise click.UsageError("--webhook URL or --routes FILE (or their IOTWATCH_ALERTS_ settings) is required")
        parts = urlsplit(config.webhook_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise click.BadParameter(f"{config.webhook_url!r} is not an http(s) URL", param_hint="--webhook")
        tree = single_receiver(config.webhook_url, timeout_s=config.webhook_timeout_s)
    options = ForwardOptions(group_id or config.forward_group_id, from_beginning, limit, timeout_s)
    counts = Dispatcher(app.settings, config, tree, stop_on_signals(), options=options).run()
    emit(counts, as_json, lambda c: click.echo(_forward_summary(c)))


def _forward_summary(counts: dict[str, Any]) -> str:
    """``alerts forward: alert records 3, delivered 3, ...``: the counters that are not zero
    (the alert records read always), and what a stop left for the next run."""
    shown = {k: v for k, v in counts.items() if k not in ("failures", "waiting") and (v or k == "alert_records")}
    text = "alerts forward: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in shown.items())
    if counts["waiting"]:
        text += f"; {counts['waiting']} alert record(s) not yet delivered are left for the next run"
    return text


def _user_option(help_text: str) -> Callable[[F], F]:
    from iotwatch.settings import user_name

    return click.option("--by", "by", default=user_name, show_default="your user name", help=help_text)


@alerts.command("list")
@endpoint_options(kafka=True)
@click.option("--open", "open_only", is_flag=True, help="Only alerts still firing (open or acknowledged).")
@click.option("--site", "sites", multiple=True, help="Only this site (repeatable).")
@click.option(
    "--severity", type=click.Choice(SEVERITIES), help="Minimum severity (critical > major > minor > warning)."
)
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Rows shown at most.")
@click.option("--all", "show_all", is_flag=True, help="Every matching alert (no --limit).")
@json_option
@pass_app
def list_alerts(
    app: AppContext,
    open_only: bool,
    sites: tuple[str, ...],
    severity: str | None,
    limit: int,
    show_all: bool,
    as_json: bool,
) -> None:
    """The current state of alerts, folded from the alert and alert-state topics: open first, most
    severe first, newest first; who acknowledged what, and which silence mutes an alert.

    The footer says how many of how many are shown; --json prints {"total", "shown",
    "truncated", "alerts"}."""
    from iotwatch.alerts.book import load_book
    from iotwatch.alerts.views import alerts_table

    book = load_book(app.settings)
    if book.malformed:
        click.echo(
            f"iotwatch: warning: skipped {book.malformed} record(s) on the alert topics that are not valid "
            "(--log-level WARNING names them)",
            err=True,
        )
    matching = list(book.select(open_only=open_only, sites=sites, min_severity=severity))
    views = matching if show_all else matching[:limit]
    result = {
        "total": len(matching),
        "shown": len(views),
        "truncated": len(views) < len(matching),
        "alerts": [v.as_dict() for v in views],
    }
    emit(result, as_json, lambda _: alerts_table(views, book, len(matching)))


def _ack_options(who: str, note: str) -> Callable[[F], F]:
    """What ``ack`` and ``unack`` take: the alert id (or prefix), who, a note."""
    return compose(
        endpoint_options(kafka=True),
        click.argument("alert_id"),
        _user_option(who),
        click.option("--note", help=note),
        json_option,
        pass_app,
    )


@alerts.command()
@_ack_options("Who acknowledges (shown to everyone on call).", "What you are doing about it.")
def ack(app: AppContext, alert_id: str, by: str, note: str | None, as_json: bool) -> None:
    """Acknowledge an open alert (ALERT_ID or a unique prefix of at least 6 characters): the forwarder
    stops repeating it; the acknowledgement is a record on the alert-state topic."""
    from iotwatch.alerts.actions import acknowledge
    from iotwatch.alerts.book import load_book

    view = acknowledge(app.settings, load_book(app.settings), alert_id, by, note)
    record = view.record
    emit(
        view.as_dict(),
        as_json,
        lambda _: click.echo(
            f"acknowledged {view.alert_id} ({record.severity} {record.rule} on {record.device_id} "
            f"at {record.site}) by {by}" + (f": {note}" if note else "")
        ),
    )


@alerts.command()
@_ack_options("Who takes the acknowledgement back.", "Why.")
def unack(app: AppContext, alert_id: str, by: str, note: str | None, as_json: bool) -> None:
    """Take back an acknowledgement (the alert is open again; critical ones are repeated again)."""
    from iotwatch.alerts.actions import acknowledge
    from iotwatch.alerts.book import load_book
    from iotwatch.contract.oncall import AlertStep

    view = acknowledge(app.settings, load_book(app.settings), alert_id, by, note, action=AlertStep.UNACKNOWLEDGED)
    emit(view.as_dict(), as_json, lambda _: click.echo(f"{view.alert_id} is open again ({by})"))


@alerts.command()
@endpoint_options(kafka=True)
@click.option("--site", help="Alerts of this site.")
@click.option("--device", "device_id", help="Alerts of this device.")
@click.option("--rule", help="Alerts of this rule.")
@click.option("--severity", type=click.Choice(SEVERITIES), help="Alerts of this severity.")
@click.option("--for", "duration", required=True, help="How long, e.g. 30m, 2h, 1d.")
@click.option("--comment", help="Why (shown with the silence).")
@_user_option("Who silences.")
@json_option
@pass_app
def silence(
    app: AppContext,
    site: str | None,
    device_id: str | None,
    rule: str | None,
    severity: str | None,
    duration: str,
    comment: str | None,
    by: str,
    as_json: bool,
) -> None:
    """Mute notifications of matching alerts for a while (every matcher given must match). Alerts are
    still recorded and listed; the forwarder does not notify them (a ``record`` receiver, as
    ``alerts forward --webhook``, still gets every alert record)."""
    from iotwatch.alerts.actions import add_silence
    from iotwatch.contract.oncall import Matchers

    seconds = _positive_duration(duration, "--for")
    created = add_silence(app.settings, Matchers(site, device_id, rule, severity), seconds, by, comment)
    emit(
        msgspec.to_builtins(created),
        as_json,
        lambda _: click.echo(f"silence {created.silence_id}: {created.matchers.describe()} for {duration} by {by}"),
    )


@alerts.command()
@endpoint_options(kafka=True)
@click.option("--all", "show_all", is_flag=True, help="Also silences that ended or were revoked.")
@json_option
@pass_app
def silences(app: AppContext, show_all: bool, as_json: bool) -> None:
    """Active silences (from the silences topic)."""
    import time

    from iotwatch.alerts.book import load_book
    from iotwatch.alerts.views import silences_table

    now = int(time.time() * 1000)
    chosen = sorted(
        (s for s in load_book(app.settings).silences.values() if show_all or s.active(now)),
        key=lambda s: -s.starts_at_ms,
    )
    emit([msgspec.to_builtins(s) for s in chosen], as_json, lambda _: silences_table(chosen, now, show_all))


@alerts.command()
@endpoint_options(kafka=True)
@click.argument("silence_id")
@_user_option("Who ends the silence.")
@json_option
@pass_app
def unsilence(app: AppContext, silence_id: str, by: str, as_json: bool) -> None:
    """End an active silence now."""
    from iotwatch.alerts.actions import revoke_silence
    from iotwatch.alerts.book import load_book

    ended = revoke_silence(app.settings, load_book(app.settings), silence_id, by)
    emit(msgspec.to_builtins(ended), as_json, lambda _: click.echo(f"silence {ended.silence_id} ended by {by}"))
