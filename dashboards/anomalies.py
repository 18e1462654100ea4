"""Anomalies: which alerts fire, where, how often, and which are still open."""

from __future__ import annotations

from typing import Any

from iotwatch.dashboards.builder import (
    GREEN,
    ORANGE,
    RED,
    SEVERITY_COLOURS,
    YELLOW,
    BarGauge,
    Dashboard,
    Override,
    Row,
    Stat,
    Table,
    Target,
    TimeSeries,
    colours,
    thresholds,
    value_text,
)
from iotwatch.dashboards.common import SCORE_CLEAR, SCORE_FIRE, per_interval, regex, site_variable

SITE = f'"site" {regex("site")}'
RAISED = "\"state\" = 'raised'"
SCORE = thresholds(GREEN, (SCORE_CLEAR, ORANGE), (SCORE_FIRE, RED))
SEVERITY_MAPPING = value_text({name: (name, color) for name, color in SEVERITY_COLOURS.items()})
STATE_MAPPING = value_text({"raised": ("raised", RED), "cleared": ("cleared", GREEN)})


def coloured_cells(column: str, mappings: list[dict[str, Any]]) -> Override:
    return Override(column, {"mappings": mappings, "custom.cellOptions": {"type": "color-background"}})


def score_cells(column: str = "score") -> Override:
    return Override(
        column,
        {
            "thresholds": SCORE,
            "custom.cellOptions": {"type": "color-text"},
            "decimals": 2,
        },
    )


#: A device id cell opens that device's drill-down (same time range).
DRILL_DOWN = Override(
    "device_id",
    {
        "links": [
            {
                "title": "Device drill-down",
                "url": "/d/iotwatch-device/device?var-site=${__data.fields.site}"
                "&var-device=${__value.raw}&${__url_time_range}",
            }
        ]
    },
)


def peak_score(where: str, description: str = "") -> Stat:
    """The highest per-minute anomaly score of the devices ``where`` selects."""
    return Stat(
        title="Peak anomaly score",
        reduce="max",
        thresholds=SCORE,
        decimals=2,
        min=0,
        max=1,
        min_interval="1m",
        description=description,
        targets=[per_interval('max("max_score")', "device_metrics", where)],
    )


def hide_time() -> dict[str, Any]:
    return {"id": "organize", "options": {"excludeByName": {"Time": True}}}


def top_devices(title: str, inner: str, column: str, unit: str, th: Any, description: str) -> BarGauge:
    """The 10 largest values of ``column`` per device (``top`` over a per-device subquery)."""
    return BarGauge(
        title=title,
        unit=unit,
        thresholds=th,
        all_values=True,
        height=10,
        description=description,
        targets=[
            Target(
                f'SELECT top("{column}", "device_id", 10) AS "{column}" FROM ({inner}) WHERE $timeFilter',
                format="table",
            )
        ],
        transformations=[{"id": "sortBy", "options": {"sort": [{"field": column, "desc": True}]}}, hide_time()],
    )


def dashboard() -> Dashboard:
    summary = Row(
        "Summary",
        [
            Stat(
                title="Alerts raised",
                reduce="sum",
                thresholds=thresholds(GREEN, (1, ORANGE), (20, RED)),
                description="Alerts raised in the time range, all rules.",
                targets=[per_interval('count("raised")', "alerts", f"{RAISED} AND {SITE}")],
            ),
            Stat(
                title="Critical raised",
                reduce="sum",
                thresholds=thresholds(GREEN, (1, RED)),
                description="Critical alerts (crash, water leak) raised in the time range.",
                targets=[
                    per_interval('count("raised")', "alerts", f"{RAISED} AND \"severity\" = 'critical' AND {SITE}")
                ],
            ),
            Stat(
                title="Alerts open now",
                graph=False,
                thresholds=thresholds(GREEN, (1, ORANGE), (10, RED)),
                description="Alerts whose last state in the time range is raised (no later cleared).",
                targets=[
                    Target(
                        f'SELECT sum("open") FROM (SELECT last("raised") AS "open" FROM "alerts" WHERE {SITE} '
                        f'AND $timeFilter GROUP BY "device_id", "rule") WHERE $timeFilter'
                    )
                ],
            ),
            peak_score(SITE, "Highest per-minute anomaly score of any device (alerts fire at 0.75)."),
        ],
    )
    over_time = Row(
        "Alerts over time",
        [
            TimeSeries(
                title="Alerts raised by severity",
                draw_style="bars",
                stacking="normal",
                legend_calcs=("sum",),
                description="Raised alerts per interval, by severity.",
                targets=[
                    per_interval('count("raised")', "alerts", f"{RAISED} AND {SITE}", '"severity"', "$tag_severity")
                ],
                overrides=colours(SEVERITY_COLOURS),
            ),
            TimeSeries(
                title="Alerts raised by rule",
                draw_style="bars",
                stacking="normal",
                legend_calcs=("sum",),
                description="Raised alerts per interval, by rule.",
                targets=[per_interval('count("raised")', "alerts", f"{RAISED} AND {SITE}", '"rule"', "$tag_rule")],
                overrides=colours(
                    {"crash": RED, "water_leak": "dark-red", "anomaly_score": YELLOW, "out_of_range": ORANGE}
                ),
            ),
        ],
    )
    devices = Row(
        "Most anomalous devices",
        [
            top_devices(
                "Top devices by anomaly score",
                f'SELECT max("max_score") AS "score" FROM "device_metrics" WHERE {SITE} AND $timeFilter '
                f'GROUP BY "device_id"',
                "score",
                "none",
                SCORE,
                "The 10 devices with the highest per-minute anomaly score in the range (0 to 1; fires at 0.75).",
            ),
            top_devices(
                "Top devices by alerts raised",
                f'SELECT count("raised") AS "alerts" FROM "alerts" WHERE "state" = \'raised\' AND {SITE} AND '
                f'$timeFilter GROUP BY "device_id"',
                "alerts",
                "short",
                thresholds(YELLOW, (5, ORANGE), (20, RED)),
                "The 10 devices that raised the most alerts in the range.",
            ),
        ],
    )
    alert_columns = [
        coloured_cells("severity", SEVERITY_MAPPING),
        coloured_cells("state", STATE_MAPPING),
        score_cells(),
        Override("message", {"custom.width": 520}),
        DRILL_DOWN,
    ]
    tables = Row(
        "Alerts",
        [
            Table(
                title="Open alerts",
                width=24,
                height=9,
                description="Per device and rule, alerts whose latest state in the time range is raised: no cleared "
                "has followed yet. Time is when the alert was raised.",
                targets=[
                    Target(
                        f'SELECT "severity", "rule", "site", "device_id", "message", "score", "occurrences" '
                        f'FROM (SELECT last("raised") AS "open", "message", "score", "occurrences" FROM "alerts" '
                        f'WHERE {SITE} AND $timeFilter GROUP BY "severity", "rule", "site", "device_id") '
                        f'WHERE "open" = 1 AND $timeFilter',
                        format="table",
                    )
                ],
                column_overrides=alert_columns,
            ),
            Table(
                title="Recent alerts",
                width=24,
                height=10,
                description="The last 200 raised and cleared alerts.",
                targets=[
                    Target(
                        f'SELECT "severity", "state", "rule", "site", "device_id", "message", "score", "value" '
                        f'FROM "alerts" WHERE {SITE} AND $timeFilter ORDER BY time DESC LIMIT 200',
                        format="table",
                    )
                ],
                column_overrides=alert_columns,
            ),
        ],
    )
    return Dashboard(
        uid="iotwatch-anomalies",
        title="iotwatch / Anomalies",
        description="Alerts by severity and rule, the most anomalous devices and the open alerts.",
        tags=("iotwatch", "alerts"),
        variables=[site_variable()],
        rows=[summary, over_time, devices, tables],
    )
