"""The events of a micro-batch, written from the stateful operator's own task, at least once
(docs/streaming-internals.md, "Event sinks").
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from iotwatch.clients.influx import OutageLog
from iotwatch.contract.alerts import alert_message
from iotwatch.contract.dead_letters import H_KAFKA_OFFSET, H_KAFKA_PARTITION, H_KAFKA_TOPIC, DeadLetter
from iotwatch.settings import Settings
from iotwatch.streaming.operator_key import source_partition
from iotwatch.streaming.sinks.influx_points import aggregate_lines, alert_point, write_derived
from iotwatch.streaming.sinks.kafka_rows import produce_all, warm_producer
from iotwatch.streaming.sinks.read_back import LogReader, with_original_bytes

if TYPE_CHECKING:
    from iotwatch.streaming.partition_io import BatchOutput

log = logging.getLogger(__name__)
#: One per Python worker, which outlives the micro-batches (and the sinks) it runs.
_influx_outage = OutageLog(log, "aggregates and alerts")


def dead_letter_record(row: dict[str, Any]) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    """A dead-letter row of the engine as a Kafka record: original bytes, why in headers."""
    key = row["device_id"].encode() if row["device_id"] else None
    letter = DeadLetter(row["reason"], row["detail"] or "", "stream", bytes(row["raw"] or b""), key)
    source = [
        *([(H_KAFKA_TOPIC, row["kafka_topic"].encode())] if row.get("kafka_topic") else []),
        (H_KAFKA_PARTITION, str(source_partition(row["kafka_partition"])).encode()),
        (H_KAFKA_OFFSET, str(row["kafka_offset"]).encode()),
    ]
    return key, letter.original, letter.headers(source)


class EventSinks:
    """Where one partition's alerts, dead letters and aggregates go."""

    def __init__(self, settings: Settings) -> None:
        self.kafka_config = settings.kafka.client_config()
        self.alerts_topic = settings.topics.alerts
        self.dlq_topic = settings.topics.dlq
        self.influx = settings.influx if settings.influx.enabled else None
        self.log = LogReader(self.kafka_config)
        warm_producer(self.kafka_config)  # once per worker: the first alert is not kept waiting

    def write(self, output: BatchOutput) -> dict[str, int]:
        """Write everything but the readings; the counts for the batch's tally. A Kafka
        failure raises (the batch fails and is re-run); an InfluxDB failure is counted."""
        alerts = output.alerts
        if alerts:
            produce_all(
                self.kafka_config,
                self.alerts_topic,
                map(alert_message, alerts),
            )
        if output.dead_letters:
            letters = with_original_bytes(self.log, output.dead_letters)
            produce_all(self.kafka_config, self.dlq_topic, map(dead_letter_record, letters))
        failures = 0
        if self.influx is not None and (alerts or len(output.aggregates)):
            lines = aggregate_lines(output.aggregates) + [alert_point(a).to_line_protocol() for a in alerts]
            failures = write_derived(self.influx, _influx_outage, lines)
        return {
            "alerts_raised": sum(a.raised for a in alerts),
            "alerts_cleared": sum(not a.raised for a in alerts),
            "aggregates": len(output.aggregates),
            "influx_write_failures": failures,
        }
