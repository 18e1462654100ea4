"""InfluxQL fragments and variables the dashboards share.

Queries keep to InfluxQL that InfluxDB 1.x, 2.x (through the DBRP mapping) and 3.x all
answer: no SLIMIT/SOFFSET, INTEGRAL, SAMPLE, SHOW SERIES or technical-analysis functions;
selectors, aggregates, ``non_negative_derivative``/``non_negative_difference``, ``top`` and
subqueries only. Grafana replaces ``$timeFilter``, ``$__interval``, ``$__interval_ms`` and the
dashboard variables before sending them.
"""

from __future__ import annotations

from typing import Any

from iotwatch.dashboards.builder import GREEN, RED, Stat, Target, Variable, thresholds, value_text

#: Per-second rate divisor for per-batch counts summed over a $__interval bucket.
PER_SECOND = "* 1000 / $__interval_ms"
MSG_PER_S = "suffix:msg/s"
#: A 1/0 health value: green UP, red DOWN.
UP_DOWN = value_text({1: ("UP", GREEN), 0: ("DOWN", RED)})
# Alert scores are calibrated to [0, 1]: fire at 0.75, may clear below 0.45 (stream settings).
SCORE_FIRE, SCORE_CLEAR = 0.75, 0.45


def regex(variable: str) -> str:
    """A tag filter that works for single, multi and All values: ``=~ /^$site$/``."""
    return f"=~ /^${variable}$/"


def tag_variable(
    name: str, key: str, label: str, where: str = "", multi: bool = True, measurement: str = "device_metrics"
) -> Variable:
    """A picker of tag ``key``'s values where ``where`` holds (which may name an earlier
    variable: chained pickers); ``multi``: several at once, and All."""
    condition = f" WHERE {where}" if where else ""
    query = f'SHOW TAG VALUES FROM "{measurement}" WITH KEY = "{key}"{condition}'
    return Variable(name, query, label=label, multi=multi, include_all=multi)


def site_variable(where: str = "", multi: bool = True) -> Variable:
    return tag_variable("site", "site", "Site", where, multi)


def device_variable(where: str = "", multi: bool = False) -> Variable:
    """Devices of the selected site(s): chained on ``$site``."""
    chained = f'"site" {regex("site")}' + (f" AND {where}" if where else "")
    return tag_variable("device", "device_id", "Device", chained, multi)


def per_interval(select: str, measurement: str, where: str = "", by: str = "", alias: str | None = None) -> Target:
    """The shape of most panels' query: ``select`` from ``measurement`` where ``where`` holds in the
    time range, per ``$__interval`` (and per the tags ``by``), empty buckets left out."""
    condition = f"{where} AND " if where else ""
    group = f"time($__interval), {by}" if by else "time($__interval)"
    return Target(
        f'SELECT {select} FROM "{measurement}" WHERE {condition}$timeFilter GROUP BY {group} fill(none)', alias=alias
    )


def gateway_rate(field: str, alias: str, where: str = "") -> Target:
    """Per-second rate of a cumulative gateway counter, summed over instances. Each instance's
    derivative is taken separately (counters restart at 0 with their gateway, which
    ``non_negative_derivative`` tolerates) and then added up."""
    condition = f"{where} AND " if where else ""
    return Target(
        f'SELECT sum("rate") AS "{alias}" FROM (SELECT non_negative_derivative(last("{field}"), 1s) AS "rate" '
        f'FROM "gateway" WHERE {condition}$timeFilter GROUP BY time($__interval), "instance" fill(none)) '
        f"WHERE $timeFilter GROUP BY time($__interval) fill(none)"
    )


def up_down(title: str, description: str, target: Target, **options: Any) -> Stat:
    """A Stat of a 1/0 health value (``target``'s last value): green UP or red DOWN."""
    return Stat(
        title=title,
        width=4,
        graph=False,
        thresholds=thresholds(RED, (1, GREEN)),
        mappings=UP_DOWN,
        description=description,
        targets=[target],
        **options,
    )
