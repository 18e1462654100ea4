"""The on-call lifecycle as InfluxDB points (``oncall_alerts``, ``alert_acks``,
``alert_resolutions``: :mod:`iotwatch.contract.measurements`), for the on-call dashboard.

The event points are written again when the forwarder replays the topics after a restart;
their timestamps are the events' own (plus a per-alert offset in nanoseconds, so two events
in one millisecond stay two points), so a rewrite overwrites and counts nothing twice.
InfluxDB failures are logged, not fatal: the dashboard is derived data. After a failed write
the points wait for the next snapshot (``interval_s``) rather than the forwarder's next tick,
and at most :data:`MAX_PENDING` wait (the oldest are dropped, counted and logged), so an
InfluxDB that is away neither slows the notifications nor grows the forwarder's memory.
"""

from __future__ import annotations

import logging
from collections import Counter

from influxdb_client import Point

from iotwatch.alerts.book import AlertBook, AlertView
from iotwatch.clients.influx import InfluxV1Client, event_time_ns
from iotwatch.contract.measurements import ALERT_ACKS, ALERT_RESOLUTIONS, ONCALL_ALERTS
from iotwatch.errors import ServiceUnavailable

log = logging.getLogger(__name__)

#: Points kept for the next write while InfluxDB is away.
MAX_PENDING = 50_000


class LifecycleMetrics:
    def __init__(self, client: InfluxV1Client, interval_s: float = 10.0) -> None:
        self.client, self.interval_ms = client, int(interval_s * 1000)
        self.pending: list[Point] = []
        self.written: set[tuple[str, str]] = set()  # (alert id, ack|clear) already queued by this process
        self.seen_groups: set[tuple[str, str]] = set()
        self.next_snapshot_ms = 0
        self.failures = 0
        self.dropped = 0  # points dropped while InfluxDB was away
        self.retry_at_ms = 0  # after a failed write, the next one is not tried before this
        self.away = False  # the last write failed: InfluxDB is lost until one succeeds

    def observe(self, view: AlertView) -> None:
        """Queue the event points ``view`` has that were not queued yet."""
        if view.raised is None:
            return
        record = view.record
        tags = {
            "site": str(record.site),
            "severity": str(record.severity),
            "rule": str(record.rule),
        }
        ack = view.acknowledgement
        if ack is not None and (view.alert_id, "ack") not in self.written:
            self.written.add((view.alert_id, "ack"))
            fields: dict[str, float | str] = {
                "seconds_to_ack": float(view.seconds_to_ack() or 0.0),
                "by": ack.by,
                "alert_id": view.alert_id,
            }
            self.pending.append(ALERT_ACKS.point(tags, fields, event_time_ns(ack.at_ms, view.alert_id), "ns"))
        if view.cleared is not None and (view.alert_id, "clear") not in self.written:
            self.written.add((view.alert_id, "clear"))
            fields = {"seconds_to_clear": float(view.seconds_to_clear() or 0.0), "alert_id": view.alert_id}
            at = event_time_ns(view.cleared.detected_at_ms, view.alert_id)
            self.pending.append(
                ALERT_RESOLUTIONS.point({**tags, "acked": "true" if view.acked else "false"}, fields, at, "ns")
            )

    def forget(self, alert_ids: set[str]) -> None:
        """Forget that these alerts' points were queued (the forwarder dropped the alerts)."""
        self.written = {key for key in self.written if key[0] not in alert_ids}

    def flush(self, book: AlertBook, now_ms: int, *, force: bool = False) -> None:
        """Write the queued points, and the snapshot when it is due (or ``force``)."""
        if force or now_ms >= self.next_snapshot_ms:
            self.pending += self.snapshot(book, now_ms)
            self.next_snapshot_ms = now_ms + self.interval_ms
        if len(self.pending) > MAX_PENDING:
            excess = len(self.pending) - MAX_PENDING
            self.dropped += excess
            del self.pending[:excess]
            log.warning("InfluxDB away: dropped the %d oldest on-call points (%d in all)", excess, self.dropped)
        if not self.pending or (now_ms < self.retry_at_ms and not force):
            return
        try:
            self.client.write_points(self.pending, precision="ns")
        except ServiceUnavailable as exc:
            self.failures += 1
            self.retry_at_ms = now_ms + self.interval_ms
            # one line when InfluxDB is lost, one when it is back; the tries between at DEBUG
            level = logging.WARNING if not self.away else logging.DEBUG
            log.log(
                level,
                "InfluxDB lost: %s; on-call points are kept (tried again every %.0f s)",
                exc,
                self.interval_ms / 1000,
            )
            self.away = True
            return
        if self.away:
            log.warning("InfluxDB back: %d on-call points written", len(self.pending))
        self.away = False
        self.pending = []

    def snapshot(self, book: AlertBook, now_ms: int) -> list[Point]:
        counts: Counter[tuple[str, str, str]] = Counter()
        for view in book.alerts.values():
            if view.firing:
                record = view.record
                group = (str(record.site), str(record.severity))
                state = "silenced" if book.silence_for(record, now_ms) else "acknowledged" if view.acked else "open"
                counts[(*group, state)] += 1
                self.seen_groups.add(group)
        return [
            ONCALL_ALERTS.point(
                {"site": site, "severity": severity},
                {state: counts[(site, severity, state)] for state in ("open", "acknowledged", "silenced")},
                now_ms * 1_000_000,
                "ns",
            )
            for site, severity in sorted(self.seen_groups)
        ]
