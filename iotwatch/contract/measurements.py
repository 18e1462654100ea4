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
from typing import TYPE_CHECKING, Any

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
        point = {"measurement": self.name, "tags": tags, "fields": fields, "time": time}  # a None field: left out
        return Point.from_dict(point, precision)  # type: ignore[arg-type, no-any-return]  # precision: a WritePrecision

    def lines(self, frame: pd.DataFrame, time_column: str) -> list[str]:
        """Rows of this measurement's tags, numeric fields (a NaN left out) and ``time_column`` as line
        protocol, built by Arrow a column at a time (the client's DataFrame serializer: ~14 us a row)."""
        unknown = set(frame.columns) - self.tags - self.fields - {time_column}
        if unknown and not self.open_fields:
            raise ValueError(f"{self.name} has no tag(s) or field(s) {sorted(unknown)}")
        if frame.empty:
            return []
        # imported here: the gateway, the responder and the alert forwarder import the contract
        import pyarrow as pa
        import pyarrow.compute as pc

        def texts(name: str) -> Any:  # pa.Array: the stubs take no str scalars
            """``name=value`` a row (escaped; an integer field's with ``i``), null for a NaN or no value."""
            kind, tag = frame[name].dtype.kind, name in self.tags
            if not tag and kind not in "biuf":
                raise TypeError(f"{self.name}.{name} is a {frame[name].dtype} field (lines() writes numbers)")
            text = pc.cast(pa.array(frame[name], from_pandas=True), pa.string())
            if tag and pc.any(pc.match_substring_regex(text, f"[{''.join(_ESCAPES)}]")).as_py():
                for mark, escaped in _ESCAPES.items():
                    text = pc.replace_substring(text, mark, escaped)
            text = pc.if_else(pc.equal(text, pa.scalar("")), None, text) if tag else text
            return pc.binary_join_element_wise(name.translate(_KEYS) + "=", text, "i" * (kind in "iu" and not tag), "")

        def joined(columns: list[Any], separator: str) -> Any:
            return pc.binary_join_element_wise(*columns, separator, null_handling="skip")

        tags = [texts(tag) for tag in sorted(self.tags & set(frame.columns))]
        fields = joined([texts(name) for name in sorted(set(frame.columns) - self.tags - {time_column})], ",")
        series = joined([self.name.translate(_KEYS), *tags], ",")
        line = joined([series, fields, pc.cast(pa.array(frame[time_column]), pa.string())], " ")
        return pc.filter(line, pc.not_equal(fields, pa.scalar(""))).to_pylist()  # type: ignore[no-any-return]  # strings

    def __str__(self) -> str:
        return self.name


#: What line protocol escapes in a measurement, a tag or a field name, or a tag value.
_ESCAPES = {",": "\\,", "=": "\\=", " ": "\\ ", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
_KEYS = str.maketrans(_ESCAPES)


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
