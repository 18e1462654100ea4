"""``iotwatch deadletters``: what the pipeline refused, why and from which device, and a replay
of chosen records once the cause is fixed (:mod:`iotwatch.application.dead_letters`)."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import click

from iotwatch.cli import AppContext, compose, emit, endpoint_options, json_option, pass_app


def _selection_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Ids and matchers, handed to ``func`` as one ``selection``
    (:class:`iotwatch.application.dead_letters.Selection`)."""

    @functools.wraps(func)
    def with_selection(
        *args: Any,
        ids: tuple[str, ...],
        reasons: tuple[str, ...],
        devices: tuple[str, ...],
        stages: tuple[str, ...],
        since: str | None,
        **kwargs: Any,
    ) -> Any:
        return func(*args, selection=_selection(ids, reasons, devices, stages, since), **kwargs)

    return compose(
        click.argument("ids", nargs=-1, metavar="[PARTITION:OFFSET]..."),
        click.option("--reason", "reasons", multiple=True, help="Only this reason (repeatable)."),
        click.option("--device", "devices", multiple=True, help="Only this device id (repeatable)."),
        click.option("--stage", "stages", multiple=True, help="Only from this stage: gateway, stream, ..."),
        click.option("--since", metavar="DURATION", help="Only those dead-lettered in the last DURATION (1h, 2d)."),
    )(with_selection)


def _page_options(what: str, default: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--limit and --all of a listing."""

    return compose(
        click.option("--limit", type=click.IntRange(min=1), default=default, help=f"{what}s shown at most."),
        click.option("--all", "show_all", is_flag=True, help=f"Every {what} (no --limit)."),
    )


def _page(items: Sequence[Any], limit: int, show_all: bool) -> tuple[Sequence[Any], dict[str, Any]]:
    """The items shown, and what a JSON listing says of them against the total."""
    shown = items if show_all else items[:limit]
    return shown, {"total": len(items), "shown": len(shown), "truncated": len(shown) < len(items)}


def _selection(
    ids: Sequence[str], reasons: Sequence[str], devices: Sequence[str], stages: Sequence[str], since: str | None
) -> Any:
    from iotwatch.alerts.records import parse_duration
    from iotwatch.application.dead_letters import Selection

    since_ms = None
    if since is not None:
        try:
            since_ms = int(time.time() * 1000 - parse_duration(since) * 1000)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from None
    for record_id in ids:
        partition, sep, offset = record_id.partition(":")
        if not (sep and partition.isdigit() and offset.isdigit()):
            raise click.BadParameter(f"{record_id!r} is not PARTITION:OFFSET (e.g. 0:17)", param_hint="ID")
    return Selection(frozenset(ids), frozenset(reasons), frozenset(devices), frozenset(stages), since_ms)


def _read(app: AppContext) -> list[Any]:
    from iotwatch.application.dead_letters import read_dead_letters

    letters, unreadable = read_dead_letters(app.settings)
    if unreadable:
        click.echo(
            f"iotwatch: warning: {unreadable} record(s) on {app.settings.topics.dlq} are not dead letters "
            "(no reason header)",
            err=True,
        )
    return letters


@click.group(context_settings={"show_default": True})
def deadletters() -> None:
    """What the gateway and the streaming job refused: list by reason and device, show records,
    replay fixed ones to the raw topic."""


@deadletters.command("list")
@endpoint_options(kafka=True)
@_selection_options
@_page_options("group", 50)
@json_option
@pass_app
def list_(app: AppContext, selection: Any, limit: int, show_all: bool, as_json: bool) -> None:
    """Dead letters grouped by reason, stage and device: how many, first and last, the newest
    detail and the id of the newest record (for `show` and `replay`); the largest group first."""
    from iotwatch.application.dead_letters import grouped

    chosen = selection.pick(_read(app))
    groups = grouped(chosen)
    shown, page = _page(groups, limit, show_all)
    result = {"topic": app.settings.topics.dlq, "dead_letters": len(chosen), **page}
    result["groups"] = [dataclasses.asdict(g) for g in shown]
    emit(result, as_json, lambda _: _groups_table(shown, len(groups), len(chosen)))


def _groups_table(groups: Sequence[Any], total: int, letters: int) -> None:
    from rich.table import Table

    from iotwatch.alerts.records import human_age
    from iotwatch.alerts.views import console, shown_of

    now = time.time() * 1000
    table = Table(pad_edge=False, box=None, header_style="bold")
    for name in ("reason", "stage", "device", "count", "last", "newest id", "detail"):
        table.add_column(name, justify="right" if name == "count" else "left", no_wrap=name != "detail")
    for g in groups:
        table.add_row(
            g.reason,
            g.stage,
            g.device,
            f"{g.count:,}",
            f"{human_age((now - g.last_ms) / 1000)} ago",
            g.last_id,
            g.detail,
        )
    out = console()
    out.print(table)
    of = f" of {letters:,} dead letter{'s' if letters != 1 else ''}"
    out.print(shown_of(len(groups), total, "groups", "largest first") + of, style="dim")


@deadletters.command()
@endpoint_options(kafka=True)
@_selection_options
@_page_options("record", 20)
@json_option
@pass_app
def show(app: AppContext, selection: Any, limit: int, show_all: bool, as_json: bool) -> None:
    """Dead letters record by record, newest first: id, reason, stage, device, MQTT topic, when,
    the detail and an excerpt of the record as it arrived."""
    from iotwatch.alerts.views import shown_of

    chosen = list(reversed(selection.pick(_read(app))))
    shown, page = _page(chosen, limit, show_all)
    result = {**page, "dead_letters": [s.as_dict() for s in shown]}

    def render(_: Any) -> None:
        for stored in shown:
            item = stored.as_dict()
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(item["dead_at_ms"] / 1000))
            click.echo(f"{item['id']}  {item['reason']}  ({item['stage']})  device {item['device']}  at {when}")
            if item["mqtt_topic"]:
                click.echo(f"  topic   {item['mqtt_topic']}")
            click.echo(f"  detail  {item['detail']}")
            click.echo(f"  record  {item['excerpt']}")
        click.echo(shown_of(len(shown), len(chosen), "dead letters", "newest first"))

    emit(result, as_json, render)


@deadletters.command()
@endpoint_options(kafka=True)
@_selection_options
@click.option("--dry-run", is_flag=True, help="Check the chosen records against the contract; produce nothing.")
@json_option
@pass_app
def replay(app: AppContext, selection: Any, dry_run: bool, as_json: bool) -> None:
    """Send chosen dead letters (ids, or --reason/--device/--stage/--since) back to the raw topic
    once their cause is fixed. Each is checked against the contract as it is now: those that
    pass are produced (keyed by device id), those that still fail are listed with their reason
    and not produced. Replaying a record twice is harmless: the streaming job drops a reading
    it has seen by (device_id, seq)."""
    from iotwatch.application.dead_letters import replay as replay_records

    if selection == type(selection)():
        raise click.UsageError("choose what to replay: ids (PARTITION:OFFSET) or --reason/--device/--stage/--since")
    chosen = selection.pick(_read(app))
    result = replay_records(app.settings, chosen, dry_run=dry_run)

    def render(r: dict[str, Any]) -> None:
        verb = "would replay" if dry_run else "replayed"
        line = f"{verb} {r['replayed']} of {len(chosen)} to {app.settings.topics.raw}"
        if r["still_invalid"]:
            reasons_now = ", ".join(f"{k} {v}" for k, v in sorted(r["still_invalid_reasons"].items()))
            line += f"; {r['still_invalid']} still refused by the contract ({reasons_now}), not sent"
        click.echo(line)

    emit(result.as_dict(), as_json, render)
