"""On-call: firing alerts by state (open, acknowledged, silenced), time to acknowledge and
time to clear (the forwarder writes these measurements, alerts/metrics.py), and the closed
loop: the device commands and their outcomes, also as annotations on every time series
(the responder writes them, responder/metrics.py)."""

from __future__ import annotations

from iotwatch.dashboards.builder import (
    BLUE,
    GREEN,
    ORANGE,
    RED,
    SEVERITY_COLOURS,
    YELLOW,
    Annotation,
    Dashboard,
    Row,
    Stat,
    Table,
    Target,
    TimeSeries,
    colours,
    thresholds,
)
from iotwatch.dashboards.common import per_interval, regex, site_variable

SITE = f'"site" {regex("site")}'
MINUTES = thresholds(GREEN, (300, ORANGE), (1800, RED))


def firing(field: str, by: str = "") -> Target:
    """Alerts firing now in ``field``'s state, summed over sites (and severities unless ``by``)."""
    group = f', "{by}"' if by else ""
    return Target(
        f'SELECT sum("{field}") AS "{field}" FROM (SELECT last("{field}") AS "{field}" FROM "oncall_alerts" '
        f'WHERE {SITE} AND $timeFilter GROUP BY time($__interval), "site", "severity" fill(previous)) '
        f"WHERE $timeFilter GROUP BY time($__interval){group} fill(none)",
        alias=f"$tag_{by}" if by else field,
    )


def dashboard() -> Dashboard:
    now = Row(
        "Now",
        [
            Stat(
                title="Open, not acknowledged",
                graph=False,
                thresholds=thresholds(GREEN, (1, RED)),
                description="Firing alerts nobody acknowledged yet (the forwarder repeats the critical ones).",
                targets=[firing("open")],
            ),
            Stat(
                title="Acknowledged, still firing",
                graph=False,
                thresholds=thresholds(GREEN, (1, YELLOW)),
                description="Firing alerts someone is working on (iotwatch alerts ack).",
                targets=[firing("acknowledged")],
            ),
            Stat(
                title="Silenced",
                graph=False,
                thresholds=thresholds(GREEN, (1, BLUE)),
                description="Firing alerts muted by an active silence (iotwatch alerts silences).",
                targets=[firing("silenced")],
            ),
            Stat(
                title="Median time to acknowledge",
                graph=False,
                unit="s",
                thresholds=MINUTES,
                description="Median seconds from raise to acknowledgement, acknowledgements in the range.",
                targets=[Target(f'SELECT median("seconds_to_ack") FROM "alert_acks" WHERE {SITE} AND $timeFilter')],
            ),
        ],
    )
    states = Row(
        "Firing alerts by state",
        [
            TimeSeries(
                title="Firing alerts: open, acknowledged, silenced",
                stacking="normal",
                line_interpolation="stepAfter",
                fill_opacity=40,
                description="Firing alerts over time by on-call state (snapshots every 10 s).",
                targets=[firing("open"), firing("acknowledged"), firing("silenced")],
                overrides=colours({"open": RED, "acknowledged": YELLOW, "silenced": BLUE}),
            ),
            TimeSeries(
                title="Open, not acknowledged, by severity",
                stacking="normal",
                line_interpolation="stepAfter",
                fill_opacity=40,
                description="Firing alerts nobody acknowledged, by severity.",
                targets=[firing("open", by="severity")],
                overrides=colours(SEVERITY_COLOURS),
            ),
        ],
    )
    times = Row(
        "Response times",
        [
            TimeSeries(
                title="Time to acknowledge",
                draw_style="points",
                unit="s",
                point_size=6,
                description="Seconds from raise to acknowledgement, per acknowledgement, by rule.",
                targets=[
                    Target(
                        f'SELECT "seconds_to_ack" FROM "alert_acks" WHERE {SITE} AND $timeFilter GROUP BY "rule"',
                        alias="$tag_rule",
                    )
                ],
            ),
            TimeSeries(
                title="Time to clear",
                draw_style="points",
                unit="s",
                point_size=6,
                description="Seconds from raise to clear, per cleared alert; acked=true: someone had "
                "acknowledged it first.",
                targets=[
                    Target(
                        f'SELECT "seconds_to_clear" FROM "alert_resolutions" WHERE {SITE} AND $timeFilter '
                        f'GROUP BY "acked"',
                        alias="acked=$tag_acked",
                    )
                ],
                overrides=colours({"acked=true": GREEN, "acked=false": ORANGE}),
            ),
        ],
    )
    log = Row(
        "Acknowledgements",
        [
            Table(
                title="Recent acknowledgements",
                width=24,
                description="Who acknowledged which alert, and how long it was open before.",
                targets=[
                    Target(
                        f'SELECT "by", "rule", "severity", "site", "seconds_to_ack", "alert_id" FROM "alert_acks" '
                        f"WHERE {SITE} AND $timeFilter ORDER BY time DESC LIMIT 100",
                        format="table",
                    )
                ],
            ),
        ],
    )
    loop = Row(
        "Closed loop: device commands",
        [
            TimeSeries(
                title="Command steps by outcome",
                draw_style="bars",
                stacking="normal",
                description="Steps of the device commands' audit trail (sent, accepted, done, rejected, failed, "
                "timed out, escalated) per interval.",
                targets=[per_interval('count("command_id")', "commands", SITE, '"status"', "$tag_status")],
                overrides=colours(
                    {
                        "done": GREEN,
                        "accepted": BLUE,
                        "sent": YELLOW,
                        "rejected": ORANGE,
                        "failed": RED,
                        "escalated": RED,
                    }
                ),
            ),
            Table(
                title="Recent commands",
                description="Each step of each command: which device, what, why (iotwatch commands has the trail).",
                targets=[
                    Target(
                        f'SELECT "device_id", "name", "status", "attempt", "text" FROM "commands" '
                        f"WHERE {SITE} AND $timeFilter ORDER BY time DESC LIMIT 100",
                        format="table",
                    )
                ],
            ),
        ],
    )
    return Dashboard(
        uid="iotwatch-oncall",
        title="iotwatch / On-call",
        description="Firing alerts by on-call state, time to acknowledge and time to clear; the "
        "device commands of the closed loop.",
        tags=("iotwatch", "alerts", "on-call"),
        variables=[site_variable()],
        annotations=[
            Annotation(
                "Commands",
                f'SELECT "text", "name", "status" FROM "commands" WHERE {SITE} AND $timeFilter',
                color=BLUE,
                text_column="text",
                tags_column="name,status",
            )
        ],
        rows=[now, states, times, log, loop],
    )
