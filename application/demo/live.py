"""The demo's live view: rates per stage, Kafka lag and the alert stream, once a second,
drawn from the harness's samples (:mod:`iotwatch.application.harness.probe`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from rich.console import Group
from rich.table import Table
from rich.text import Text

from iotwatch.application.harness.probe import LiveState, Sample

SEVERITY_STYLE = {"critical": "bold red", "major": "red", "minor": "yellow", "warning": "cyan"}


def _rate(state: LiveState, pick: Callable[[Sample], float]) -> float:
    if len(state.samples) < 2:
        return 0.0
    a, b = state.samples[-min(len(state.samples), 6)], state.samples[-1]
    return max(0.0, (pick(b) - pick(a)) / max(b.t - a.t, 1e-6))


def kafka_note(gateway: Mapping[str, float]) -> str:
    """What the gateways say of Kafka: up, DOWN (at how many of them), or nothing known when
    no gateway answered (stopped at the end of a run, or busy), rather than a DOWN it did not say."""
    answered, up = int(gateway.get("answered", 0)), int(gateway.get("kafka_up", 0))
    if not answered:
        return "gateway not answering"
    if up >= answered:
        return "kafka up"
    return "kafka DOWN" if answered == 1 else f"kafka DOWN at {answered - up} of {answered} gateways"


def render(state: LiveState, started: float, duration: float | None, phase: str) -> Group:
    """The rich renderable for one refresh."""
    last = state.samples[-1] if state.samples else Sample(time.time(), {}, 0, 0, 0)
    elapsed = time.time() - started
    title = Text(
        f"iotwatch demo - {phase} - {elapsed:5.0f} s" + (f" / {duration:.0f} s" if duration else ""), style="bold"
    )
    stages = Table(title="stages", expand=True)
    for column in ("stage", "total", "rate /s", "notes"):
        stages.add_column(column, justify="right" if column in ("total", "rate /s") else "left")
    gw = last.gateway
    stages.add_row(
        "gateway received (MQTT)",
        f"{gw.get('received', 0):.0f}",
        f"{_rate(state, lambda s: s.gateway.get('received', 0)):.0f}",
        f"in flight {gw.get('inflight', 0):.0f}, dead letters {gw.get('dead_lettered', 0):.0f}",
    )
    stages.add_row(
        "gateway -> Kafka",
        f"{gw.get('forwarded', 0):.0f}",
        f"{_rate(state, lambda s: s.gateway.get('forwarded', 0)):.0f}",
        kafka_note(gw),
    )
    stages.add_row("Kafka raw topic", f"{last.raw_end}", f"{_rate(state, lambda s: s.raw_end):.0f}", "")
    lag = max(0, last.raw_end - last.stream_offset)
    stages.add_row(
        "stream job (processed)",
        f"{last.stream_offset}",
        f"{_rate(state, lambda s: s.stream_offset):.0f}",
        f"lag {lag}",
    )
    stages.add_row("alerts", f"{last.alerts}", f"{_rate(state, lambda s: s.alerts):.1f}", "")
    alerts = Table(title="latest alerts", expand=True)
    for column, width in (("severity", 8), ("state", 7), ("rule", 13), ("device", 24)):
        alerts.add_column(column, min_width=width, no_wrap=True, overflow="ellipsis")
    alerts.add_column("message", overflow="ellipsis", no_wrap=True, ratio=1)
    for alert in state.recent_alerts:
        style = SEVERITY_STYLE.get(alert.severity, "")
        alerts.add_row(
            Text(alert.severity, style=style),
            alert.state,
            alert.rule,
            alert.device_id,
            alert.message,
        )
    return Group(title, stages, alerts)
