"""Vehicles: speed and acceleration with crash markers, positions on a map."""

from __future__ import annotations

from iotwatch.dashboards.anomalies import peak_score
from iotwatch.dashboards.builder import (
    GREEN,
    ORANGE,
    RED,
    Annotation,
    Dashboard,
    Geomap,
    Override,
    Row,
    Stat,
    Table,
    Target,
    TimeSeries,
    thresholds,
)
from iotwatch.dashboards.common import device_variable, per_interval, regex, site_variable

VEHICLE = "\"device_type\" = 'vehicle_edr'"
DEVICES = f'{VEHICLE} AND "device_id" {regex("device")}'
CRASHES = f"\"rule\" = 'crash' AND \"state\" = 'raised' AND {DEVICES}"
# The crash rule fires at 4 g of longitudinal deceleration (iotwatch.models.crash.is_crash).
ACCEL = thresholds(RED, (-4, GREEN), (4, ORANGE))


def metric(name: str, select: str, alias: str = "$tag_device_id") -> Target:
    return per_interval(select, "device_metrics", f"\"metric\" = '{name}' AND {DEVICES}", '"device_id"', alias)


def position(name: str, column: str) -> Target:
    return Target(
        f'SELECT last("last") AS "{column}" FROM "device_metrics" WHERE "metric" = \'{name}\' AND {DEVICES} '
        f'AND $timeFilter GROUP BY time($__interval), "device_id" fill(none)',
        format="table",
    )


def dashboard() -> Dashboard:
    summary = Row(
        "Fleet",
        [
            Stat(
                title="Crashes",
                reduce="sum",
                graph=False,
                thresholds=thresholds(GREEN, (1, RED)),
                description="Crash alerts raised in the time range.",
                targets=[Target(f'SELECT count("raised") FROM "alerts" WHERE {CRASHES} AND $timeFilter')],
            ),
            Stat(
                title="Top speed",
                unit="velocitykmh",
                reduce="max",
                decimals=0,
                min_interval="1m",
                thresholds=thresholds(GREEN, (130, ORANGE), (180, RED)),
                targets=[per_interval('max("max")', "device_metrics", f"\"metric\" = 'speed_kmh' AND {DEVICES}")],
            ),
            Stat(
                title="Hardest deceleration",
                unit="accG",
                reduce="min",
                decimals=1,
                min_interval="1m",
                thresholds=ACCEL,
                description="Most negative longitudinal acceleration (crash rule: -4 g).",
                targets=[per_interval('min("min")', "device_metrics", f"\"metric\" = 'accel_x_g' AND {DEVICES}")],
            ),
            peak_score(DEVICES),
        ],
    )
    driving = Row(
        "Driving (red markers: crashes)",
        [
            TimeSeries(
                title="Speed",
                unit="velocitykmh",
                min=0,
                min_interval="1m",
                height=9,
                thresholds=thresholds(GREEN, (130, ORANGE)),
                threshold_style="dashed",
                description="Per-minute mean speed per vehicle.",
                targets=[metric("speed_kmh", 'mean("mean")')],
            ),
            TimeSeries(
                title="Longitudinal acceleration (min / max per minute)",
                unit="accG",
                min_interval="1m",
                height=9,
                thresholds=ACCEL,
                threshold_style="dashed",
                description="Per-minute extremes of accel_x_g (positive = forward). Below -4 g is a crash.",
                targets=[
                    metric("accel_x_g", 'min("min")', alias="$tag_device_id min"),
                    metric("accel_x_g", 'max("max")', alias="$tag_device_id max"),
                ],
                overrides=[
                    Override(".* min$", {"custom.lineStyle": {"fill": "solid"}}, regex=True),
                    Override(".* max$", {"custom.lineStyle": {"fill": "dash", "dash": [4, 4]}}, regex=True),
                ],
            ),
        ],
    )
    where = Row(
        "Where",
        [
            Geomap(
                title="Positions",
                width=16,
                height=12,
                description="Last position per vehicle and interval (lat_deg/lon_deg). Zoom to fit.",
                targets=[position("lat_deg", "lat"), position("lon_deg", "lon")],
                transformations=[{"id": "merge", "options": {}}],
            ),
            Table(
                title="Crash events",
                width=8,
                height=12,
                description="Crash alerts: where (site/vehicle) and the deceleration that triggered them.",
                targets=[
                    Target(
                        f'SELECT "device_id", "site", "value", "message" FROM "alerts" WHERE {CRASHES} AND '
                        f"$timeFilter ORDER BY time DESC LIMIT 100",
                        format="table",
                    )
                ],
                column_overrides=[Override("value", {"unit": "accG", "decimals": 1, "displayName": "accel"})],
            ),
        ],
    )
    return Dashboard(
        uid="iotwatch-vehicles",
        title="iotwatch / Vehicles",
        description="Vehicle event data recorders: speed, acceleration, crashes and positions.",
        tags=("iotwatch", "vehicles"),
        refresh="1m",
        variables=[site_variable(VEHICLE), device_variable(VEHICLE, multi=True)],
        annotations=[
            Annotation(
                "Crashes",
                f'SELECT "message", "device_id" FROM "alerts" WHERE {CRASHES} AND $timeFilter',
                color=RED,
                text_column="message",
                tags_column="device_id",
            )
        ],
        rows=[summary, driving, where],
    )
