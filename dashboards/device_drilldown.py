"""Device drill-down: one device's metrics with its anomaly score and alerts."""

from __future__ import annotations

from iotwatch.dashboards.anomalies import (
    RAISED,
    SCORE,
    SEVERITY_MAPPING,
    STATE_MAPPING,
    coloured_cells,
    peak_score,
    score_cells,
)
from iotwatch.dashboards.builder import (
    BLUE,
    GREEN,
    ORANGE,
    RED,
    Annotation,
    Dashboard,
    Override,
    Row,
    Stat,
    Table,
    Target,
    TimeSeries,
    colour,
    thresholds,
)
from iotwatch.dashboards.common import device_variable, per_interval, regex, site_variable, tag_variable

DEVICE = f'"device_id" {regex("device")}'
METRIC = f'"metric" {regex("metric")}'


def dashboard() -> Dashboard:
    metric = tag_variable("metric", "metric", "Metric", DEVICE)
    overview = Row(
        "Device",
        [
            Stat(
                title="Readings",
                reduce="sum",
                thresholds=thresholds(BLUE),
                min_interval="1m",
                description="Readings of this device in the time range, per selected metric.",
                targets=[
                    per_interval('sum("count")', "device_metrics", f"{DEVICE} AND {METRIC}", '"metric"', "$tag_metric")
                ],
            ),
            peak_score(DEVICE, "Highest per-minute anomaly score of any metric (alerts fire at 0.75)."),
            Stat(
                title="Alerts raised",
                reduce="sum",
                thresholds=thresholds(GREEN, (1, ORANGE), (5, RED)),
                description="Alerts this device raised in the time range.",
                targets=[per_interval('count("raised")', "alerts", f"{RAISED} AND {DEVICE}")],
            ),
            Stat(
                title="Alerts open now",
                graph=False,
                thresholds=thresholds(GREEN, (1, RED)),
                description="Rules whose latest alert state for this device is raised.",
                targets=[
                    Target(
                        f'SELECT sum("open") FROM (SELECT last("raised") AS "open" FROM "alerts" WHERE {DEVICE} '
                        f'AND $timeFilter GROUP BY "rule") WHERE $timeFilter'
                    )
                ],
            ),
        ],
    )
    metrics = Row(
        "Metrics (one panel per metric)",
        [
            TimeSeries(
                title="$metric",
                unit=None,
                repeat="metric",
                min_interval="1m",
                fill_opacity=0,
                legend_calcs=("min", "mean", "max"),
                description="Per-minute mean with min and max (event time), and the anomaly score of the "
                "same minutes on the right axis (0 to 1, alerts fire at 0.75). Red markers: alerts.",
                targets=[
                    per_interval(
                        'mean("mean") AS "mean", min("min") AS "min", max("max") AS "max"',
                        "device_metrics",
                        f"{DEVICE} AND {METRIC}",
                    ),
                    per_interval('max("max_score") AS "anomaly score"', "device_metrics", f"{DEVICE} AND {METRIC}"),
                ],
                overrides=[
                    colour("mean", BLUE, custom__lineWidth=2),
                    colour("min", "light-blue", custom__lineStyle={"fill": "dash", "dash": [4, 4]}),
                    colour("max", "light-blue", custom__lineStyle={"fill": "dash", "dash": [4, 4]}),
                    Override(
                        "anomaly score",
                        {
                            "custom.axisPlacement": "right",
                            "min": 0,
                            "max": 1,
                            "unit": "none",
                            "custom.drawStyle": "bars",
                            "custom.fillOpacity": 40,
                            "color": {"mode": "thresholds"},
                            "thresholds": SCORE,
                        },
                    ),
                ],
            ),
        ],
    )
    alerts = Row(
        "Alerts",
        [
            Table(
                title="Alerts of this device",
                width=24,
                description="Raised and cleared alerts of this device in the time range.",
                targets=[
                    Target(
                        f'SELECT "severity", "state", "rule", "message", "score", "value", "occurrences" '
                        f'FROM "alerts" WHERE {DEVICE} AND $timeFilter ORDER BY time DESC LIMIT 200',
                        format="table",
                    )
                ],
                column_overrides=[
                    coloured_cells("severity", SEVERITY_MAPPING),
                    coloured_cells("state", STATE_MAPPING),
                    score_cells(),
                    Override("message", {"custom.width": 560}),
                ],
            ),
        ],
    )
    return Dashboard(
        uid="iotwatch-device",
        title="iotwatch / Device drill-down",
        description="Pick a site, then a device: its metrics, anomaly score, alerts and the commands it was sent.",
        tags=("iotwatch", "devices"),
        refresh="1m",
        variables=[site_variable(multi=False), device_variable(), metric],
        annotations=[
            Annotation(
                "Alerts",
                f'SELECT "message", "rule", "severity", "state" FROM "alerts" WHERE {DEVICE} AND $timeFilter',
                color=RED,
                text_column="message",
                tags_column="rule,severity,state",
            ),
            Annotation(
                "Commands",
                f'SELECT "text", "name", "status" FROM "commands" WHERE {DEVICE} AND $timeFilter',
                color=BLUE,
                text_column="text",
                tags_column="name,status",
            ),
        ],
        rows=[overview, metrics, alerts],
    )
