"""The InfluxDB measurements: the aggregates and metrics each stage writes and the Grafana
dashboards read. Each has one definition here -- its tags, its fields, who writes it -- and
its writers build their points through it (:meth:`Measurement.point`), so a point with a
tag or field the contract does not name fails where it is written, and a dashboard query
that names one fails its test (``tests/unit/dashboards``).

>>> point = DEVICE_METRICS.point(
...     {"site": "home-1", "device_type": "thermostat", "device_id": "d", "metric": "temperature_c"},
...     {"mean": 21.0, "min": 20.5, "max": 21.4, "last": 21.1, "max_score": 0.2, "count": 60},
...     1_763_784_000_000,
... )
>>> point.to_line_protocol().split(" ")[0]
'device_metrics,device_id=d,device_type=thermostat,metric=temperature_c,site=home-1'
>>> DEVICE_METRICS.point({"room": "kitchen"}, {}, 0)
Traceback (most recent call last):
ValueError: device_metrics has no tag(s) ['room'] (tags: device_id, device_type, metric, site)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from influxdb_client import Point

if TYPE_CHECKING:
    import pandas as pd

FieldValue = float | int | str | bool


@dataclass(frozen=True)
class Measurement:
    """One measurement: its name, tags and fields, and who writes it. ``open_fields`` is for a
    family of counters whose names come from the writer (the job's per-batch tally)."""

    name: str
    tags: frozenset[str]
    fields: frozenset[str]
    written_by: str
    open_fields: bool = False

    def point(
        self, tags: Mapping[str, str], fields: Mapping[str, FieldValue | None], time: int, precision: str = "ms"
    ) -> Point:
        """A point of this measurement; fields that are None are left out."""
        unknown_tags = tags.keys() - self.tags
        if unknown_tags:
            raise ValueError(f"{self.name} has no tag(s) {sorted(unknown_tags)} (tags: {', '.join(sorted(self.tags))})")
        unknown_fields = set() if self.open_fields else fields.keys() - self.fields
        if unknown_fields:
            raise ValueError(
                f"{self.name} has no field(s) {sorted(unknown_fields)} (fields: {', '.join(sorted(self.fields))})"
            )
        point = Point(self.name)
        for tag, text in tags.items():
            point.tag(tag, text)
        for field, value in fields.items():
            if value is not None:
                point.field(field, value)
        point.time(time, precision)
        return point

    def lines(self, frame: pd.DataFrame, time_column: str, precision: str = "ms") -> list[str]:
        """The rows of ``frame`` as line protocol, its columns this measurement's tags and fields
        (NaN fields left out) and ``time_column``: one compiled format for the whole frame
        (the client's DataFrame serializer), not a :class:`Point` per row, for writers of
        thousands of points a batch."""
        unknown = set(frame.columns) - self.tags - self.fields - {time_column}
        if unknown and not self.open_fields:
            raise ValueError(f"{self.name} has no tag(s) or field(s) {sorted(unknown)}")
        if frame.empty:
            return []
        # imported here (they import pandas): the gateway, the responder and the alert
        # forwarder import the contract, and pandas would add seconds to each one's start-up
        from influxdb_client.client.write.dataframe_serializer import data_frame_to_list_of_points
        from influxdb_client.client.write_api import PointSettings

        lines: list[str] = data_frame_to_list_of_points(
            frame.copy(),  # the serializer converts the time column in place
            PointSettings(),
            precision,
            data_frame_measurement_name=self.name,
            data_frame_tag_columns=sorted(self.tags & set(frame.columns)),
            data_frame_timestamp_column=time_column,
        )
        return lines

    def __str__(self) -> str:
        return self.name


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


DEVICE_METRICS = Measurement(
    "device_metrics",
    _names("site device_type device_id metric"),
    _names("mean min max last count max_score"),
    "the streaming job: one point per device, metric and closed event-time bucket",
)
ALERTS = Measurement(
    "alerts",
    _names("severity rule state site device_type device_id"),
    _names("alert_id message occurrences raised score value"),
    "the streaming job: one point per raised or cleared alert (the alert record's fields)",
)
PIPELINE = Measurement(
    "pipeline",
    _names("stage"),
    frozenset(),
    "the streaming job: its per-batch tally (stage=stream) and query progress (stage=stream_progress)",
    open_fields=True,
)
GATEWAY = Measurement(
    "gateway",
    _names("instance"),
    _names(
        "received forwarded dead_lettered delivery_failures duplicates seq_gaps inflight oldest_inflight_s "
        "newest_reading_age_s kafka_up mqtt_connected delivery_latency_ms_p50 delivery_latency_ms_p99"
    ),
    "each gateway instance: its counters and health, once per status period",
)
GATEWAY_DEAD_LETTERS = Measurement(
    "gateway_dead_letters",
    _names("instance reason"),
    _names("count"),
    "each gateway instance: dead letters so far, by reason",
)
COMMANDS = Measurement(
    "commands",
    _names("site device_type device_id name status"),
    _names("text command_id attempt"),
    "the responder: one point per step of a device command",
)
ALERT_ACKS = Measurement(
    "alert_acks",
    _names("site severity rule"),
    _names("seconds_to_ack by alert_id"),
    "the alert forwarder: one point per acknowledgement",
)
ALERT_RESOLUTIONS = Measurement(
    "alert_resolutions",
    _names("site severity rule acked"),
    _names("seconds_to_clear alert_id"),
    "the alert forwarder: one point per cleared alert",
)
ONCALL_ALERTS = Measurement(
    "oncall_alerts",
    _names("site severity"),
    _names("open acknowledged silenced"),
    "the alert forwarder: firing alerts by on-call state, per site and severity, periodically",
)
REPLICATION = Measurement(
    "replication",
    _names("source target"),
    _names("lag_ms"),
    "the sites' replication monitor (the demo, `iotwatch stack lag --watch`): per site, how far "
    "the central cluster is behind it, from MirrorMaker 2's heartbeats",
)

#: Every measurement, by name.
MEASUREMENTS: dict[str, Measurement] = {
    m.name: m
    for m in (
        DEVICE_METRICS,
        ALERTS,
        PIPELINE,
        GATEWAY,
        GATEWAY_DEAD_LETTERS,
        COMMANDS,
        ALERT_ACKS,
        ALERT_RESOLUTIONS,
        ONCALL_ALERTS,
        REPLICATION,
    )
}
