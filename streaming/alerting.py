"""Alert lifecycle with anti-flap, as mature alerting tools do it: a hold before firing, a
clear level below the fire level, one alert per (device, rule), deterministic alert ids
(docs/streaming-internals.md, "Alert lifecycle").
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from iotwatch.contract.alerts import AlertLifecycle, AlertRecord, Contributor, Severity


@dataclass(frozen=True)
class RuleSpec:
    """How one rule fires and clears."""

    name: str
    severity: Severity
    fire: float
    clear: float
    hold: int = 1
    clear_hold: int = 1
    detector: str = "rule"
    hold_ms: int = 0  # and for this long in event time (a condition that must persist, whatever the rate)
    runbook_url: str | None = None  # what on-call should do about it; carried by every alert of the rule


@dataclass(frozen=True)
class Observation:
    """What a rule saw in one reading."""

    score: float  # in [0, 1]; compared with the rule's fire/clear levels
    metric: str | None
    value: float | None
    threshold: float | None
    message: str
    contributors: tuple[tuple[str, float, float], ...] = ()  # (metric, value, score), strongest first


class EpisodeStatus(StrEnum):
    """Where a (device, rule) is in its alert lifecycle."""

    IDLE = "idle"  # nothing firing; keeps no state
    PENDING = "pending"  # firing, not yet for ``hold`` observations
    OPEN = "open"  # raised, not yet cleared


@dataclass
class Episode:
    """Per-(device, rule) alert state, kept in the device's state (a few fields)."""

    status: EpisodeStatus = EpisodeStatus.IDLE
    above: int = 0
    below: int = 0
    start_ms: int = 0
    start_seq: int = 0
    last_ms: int = 0
    occurrences: int = 0
    peak_score: float = 0.0
    alert_id: str = ""
    metric: str | None = None  # the metric the alert was raised on: its clear speaks of the same one


def alert_id(device_id: str, rule: str, start_ms: int) -> str:
    """Deterministic id of the alert that started at event time ``start_ms``."""
    return hashlib.sha256(f"{device_id}|{rule}|{start_ms}".encode()).hexdigest()[:24]


@dataclass
class DeviceIdentity:
    device_id: str
    device_type: str
    site: str


@dataclass
class AlertContext:
    """Fields every alert of a device carries."""

    device: DeviceIdentity
    model_version: str = "unversioned"
    now_ms: Any = field(default=lambda: int(time.time() * 1000))


def advance(
    episode: Episode,
    spec: RuleSpec,
    score: float,
    event_ms: int,
    seq: int,
    ctx: AlertContext,
    describe: Callable[[], Observation],
) -> AlertRecord | None:
    """Advance one rule's episode by one reading's score; returns an alert record to publish
    (``raised`` or ``cleared``) or None. The lifecycle needs only the score: ``describe``
    builds the full observation (message, contributors) when an alert is raised or cleared."""
    firing = score >= spec.fire
    if episode.status is not EpisodeStatus.OPEN:
        if not firing:
            episode.status, episode.above = EpisodeStatus.IDLE, 0
            return None
        if episode.status is EpisodeStatus.IDLE:
            episode.status, episode.start_ms, episode.start_seq = EpisodeStatus.PENDING, event_ms, seq
            episode.peak_score = 0.0
        episode.above += 1
        episode.last_ms = event_ms
        episode.peak_score = max(episode.peak_score, score)
        if episode.above < spec.hold or event_ms - episode.start_ms < spec.hold_ms:
            return None
        episode.status, episode.below, episode.occurrences = EpisodeStatus.OPEN, 0, episode.above
        episode.alert_id = alert_id(ctx.device.device_id, spec.name, episode.start_ms)
        observation = describe()
        episode.metric = observation.metric
        return _record(AlertLifecycle.RAISED, episode, spec, observation, ctx, seq)
    # open
    if score >= spec.clear:
        episode.below = 0
        if firing:
            episode.occurrences += 1
            episode.last_ms = event_ms
            episode.peak_score = max(episode.peak_score, score)
        return None
    episode.below += 1
    if episode.below < spec.clear_hold:
        return None
    record = _record(AlertLifecycle.CLEARED, episode, spec, describe(), ctx, seq)
    episode.status, episode.above, episode.below, episode.metric = EpisodeStatus.IDLE, 0, 0, None
    return record


def _record(
    state: AlertLifecycle, episode: Episode, spec: RuleSpec, obs: Observation, ctx: AlertContext, seq: int
) -> AlertRecord:
    device = ctx.device
    verb = "raised" if state == AlertLifecycle.RAISED else "cleared"
    where = f"{device.device_type} {device.device_id} at {device.site}"
    message = f"[{spec.severity.value.upper()}] {spec.name} {verb} on {where}: {obs.message}"
    if state == AlertLifecycle.CLEARED and obs.metric is not None:  # the record's score is the episode's peak
        message += f"; peak score {episode.peak_score:.2f} while open"
    return AlertRecord(
        alert_id=episode.alert_id,
        state=state,
        severity=spec.severity,
        rule=spec.name,
        detector=spec.detector,
        device_id=device.device_id,
        device_type=device.device_type,
        site=device.site,
        metric=obs.metric,
        value=obs.value,
        score=round(obs.score if state == AlertLifecycle.RAISED else episode.peak_score, 4),
        threshold=obs.threshold,
        fire_score=spec.fire,
        clear_score=spec.clear,
        contributors=[Contributor(m, v, round(s, 4)) for m, v, s in obs.contributors[:3]],
        first_seq=episode.start_seq,
        seq=seq,
        first_event_ms=episode.start_ms,
        last_event_ms=episode.last_ms,
        occurrences=episode.occurrences,
        detected_at_ms=ctx.now_ms(),
        model_version=ctx.model_version,
        message=message,
        runbook_url=spec.runbook_url,
    )
