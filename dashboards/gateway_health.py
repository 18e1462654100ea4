"""Gateway health: connectivity, in-flight backlog, delivery latency and dead letters."""

from __future__ import annotations

from iotwatch.dashboards.builder import (
    BLUE,
    GREEN,
    ORANGE,
    PURPLE,
    RED,
    YELLOW,
    BarGauge,
    Dashboard,
    Row,
    Stat,
    Target,
    TimeSeries,
    colour,
    colours,
    thresholds,
)
from iotwatch.dashboards.common import MSG_PER_S, UP_DOWN, per_interval, regex, tag_variable, up_down

INSTANCE = f'"instance" {regex("instance")}'
LATENCY = thresholds(GREEN, (500, ORANGE), (2_000, RED))
INFLIGHT_S = thresholds(GREEN, (5, ORANGE), (30, RED))
INFLIGHT = thresholds(GREEN, (1_000, ORANGE), (10_000, RED))


def last(field: str, alias: str = "$tag_instance") -> Target:
    return per_interval(f'last("{field}")', "gateway", INSTANCE, '"instance"', alias)


def rate(
    field: str, label: str, measurement: str = "gateway", by: str = '"instance"', alias: str = "$tag_instance"
) -> Target:
    return per_interval(f'non_negative_derivative(last("{field}"), 1s) AS "{label}"', measurement, INSTANCE, by, alias)


def dashboard() -> Dashboard:
    instance = tag_variable("instance", "instance", "Gateway", measurement="gateway")
    status = Row(
        "Status (last report per instance)",
        [
            up_down("Kafka", "1 while the instance can reach Kafka.", last("kafka_up")),
            up_down("MQTT", "1 while the instance is connected to the MQTT broker.", last("mqtt_connected")),
            Stat(
                title="In flight",
                width=4,
                unit="short",
                thresholds=INFLIGHT,
                description="Messages received but not yet confirmed by Kafka (not yet acknowledged to MQTT).",
                targets=[last("inflight")],
            ),
            Stat(
                title="Oldest in flight",
                width=4,
                unit="s",
                decimals=1,
                thresholds=INFLIGHT_S,
                description="Age of the oldest unconfirmed message: grows while Kafka is down.",
                targets=[last("oldest_inflight_s")],
            ),
            Stat(
                title="Delivery latency p99",
                width=4,
                unit="ms",
                thresholds=LATENCY,
                description="MQTT receipt to Kafka confirmation, 99th percentile of recent deliveries.",
                targets=[last("delivery_latency_ms_p99")],
            ),
            Stat(
                title="Forwarded",
                width=4,
                unit=MSG_PER_S,
                decimals=1,
                thresholds=thresholds(BLUE),
                description="Readings per second confirmed by Kafka on the raw topic (dead letters not included).",
                targets=[rate("forwarded", "forwarded")],
            ),
        ],
    )
    flow = Row(
        "Throughput and backlog",
        [
            TimeSeries(
                title="Received and forwarded",
                unit=MSG_PER_S,
                description="Per-second rates of the cumulative counters (restarts at 0 are ignored); "
                "received = forwarded + dead-lettered + in flight.",
                targets=[
                    rate("received", "received", alias="$tag_instance received"),
                    rate("forwarded", "forwarded", alias="$tag_instance forwarded"),
                ],
                overrides=colours({".* received$": BLUE, ".* forwarded$": GREEN}, regex=True),
            ),
            TimeSeries(
                title="In flight and ages",
                thresholds=INFLIGHT,
                description="Unconfirmed messages (left); the age of the oldest one and the event-time age "
                "of the newest reading received (right, seconds): the second grows while the MQTT broker "
                "holds a backlog for the gateway.",
                targets=[
                    last("inflight", alias="$tag_instance in flight"),
                    last("oldest_inflight_s", alias="$tag_instance oldest (s)"),
                    last("newest_reading_age_s", alias="$tag_instance newest reading age (s)"),
                ],
                overrides=[
                    colour(".* oldest \\(s\\)$", ORANGE, regex=True, unit="s", custom__axisPlacement="right"),
                    colour(".* reading age \\(s\\)$", BLUE, regex=True, unit="s", custom__axisPlacement="right"),
                ],
            ),
        ],
    )
    latency = Row(
        "Delivery",
        [
            TimeSeries(
                title="Delivery latency p50 / p99",
                unit="ms",
                thresholds=LATENCY,
                threshold_style="dashed",
                description="MQTT receipt to Kafka confirmation.",
                targets=[
                    last("delivery_latency_ms_p50", alias="$tag_instance p50"),
                    last("delivery_latency_ms_p99", alias="$tag_instance p99"),
                ],
                overrides=colours({".* p50$": GREEN, ".* p99$": PURPLE}, regex=True),
            ),
            TimeSeries(
                title="Connectivity",
                unit=None,
                min=0,
                max=1,
                line_interpolation="stepAfter",
                fill_opacity=30,
                mappings=UP_DOWN,
                legend_calcs=("min", "lastNotNull"),
                description="Kafka reachable and MQTT connected per instance (1 = up, 0 = down).",
                targets=[
                    last("kafka_up", alias="$tag_instance kafka"),
                    last("mqtt_connected", alias="$tag_instance mqtt"),
                ],
            ),
        ],
    )
    errors = Row(
        "Dead letters and delivery problems",
        [
            TimeSeries(
                title="Dead letters by reason",
                unit=MSG_PER_S,
                draw_style="bars",
                stacking="normal",
                legend_calcs=("sum", "max"),
                description="Messages per second sent to the dead-letter topic.",
                targets=[
                    rate(
                        "count",
                        "dead letters",
                        "gateway_dead_letters",
                        '"instance", "reason"',
                        alias="$tag_reason ($tag_instance)",
                    )
                ],
            ),
            BarGauge(
                title="Dead letters by reason (time range)",
                unit="short",
                reduce="sum",
                thresholds=thresholds(ORANGE, (100, RED)),
                description="Dead-lettered messages per reason in the time range (restart-safe increase).",
                targets=[
                    Target(
                        f'SELECT sum("n") FROM (SELECT non_negative_difference(last("count")) AS "n" '
                        f'FROM "gateway_dead_letters" WHERE {INSTANCE} AND $timeFilter '
                        f'GROUP BY time($__interval), "instance", "reason" fill(none)) WHERE $timeFilter '
                        f'GROUP BY "reason"',
                        alias="$tag_reason",
                    )
                ],
            ),
            TimeSeries(
                title="Delivery failures, duplicates and sequence gaps",
                unit=MSG_PER_S,
                width=24,
                description="Kafka delivery errors (re-produced), repeated messages (redelivery or device "
                "resend) and seqs missing between a device's messages (possible loss upstream).",
                targets=[
                    rate("delivery_failures", "failures", alias="$tag_instance delivery failures"),
                    rate("duplicates", "duplicates", alias="$tag_instance duplicates"),
                    rate("seq_gaps", "gaps", alias="$tag_instance seq gaps"),
                ],
                overrides=colours(
                    {".* delivery failures$": RED, ".* duplicates$": YELLOW, ".* seq gaps$": ORANGE}, regex=True
                ),
            ),
        ],
    )
    return Dashboard(
        uid="iotwatch-gateway",
        title="iotwatch / Gateway health",
        description="MQTT to Kafka gateway: connectivity, backlog, latency and dead letters.",
        tags=("iotwatch", "gateway"),
        variables=[instance],
        rows=[status, flow, latency, errors],
    )
