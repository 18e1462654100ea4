"""Kafka records per micro-batch, from the sources of Spark's progress reports (no Spark needed)."""

from __future__ import annotations

from typing import Any

from pyspark.sql.streaming.listener import SourceProgress

from iotwatch.streaming.progress import kafka_lag, kafka_records


class _Report:
    """The part of a ``StreamingQueryProgress`` that the Kafka counts read."""

    def __init__(self, *sources: SourceProgress) -> None:
        self.sources = list(sources)


def _source(start: Any, end: Any, latest: Any) -> SourceProgress:
    return SourceProgress.fromJson(
        {
            "description": "KafkaV2[Subscribe[iot.telemetry.raw]]",
            "startOffset": start,
            "endOffset": end,
            "latestOffset": latest,
            "numInputRows": 1,
            "inputRowsPerSecond": 0.0,
            "processedRowsPerSecond": 0.0,
        }
    )


def test_a_batch_reads_the_records_between_its_start_and_end_offsets() -> None:
    report = _Report(
        _source(
            {"iot.telemetry.raw": {"0": 100, "1": 7}},
            {"iot.telemetry.raw": {"0": 130, "1": 9}},
            {"iot.telemetry.raw": {"0": 150, "1": 9}},
        )
    )
    assert kafka_records(report) == 32
    assert kafka_lag(report) == 20


def test_a_first_batch_has_no_start_offsets_and_no_count_from_offsets() -> None:
    """Spark reports a query's first batch without start offsets: a job that starts at the end
    of a topic with 12,500 records must not be said to have read them."""
    report = _Report(_source(None, {"iot.telemetry.raw": {"0": 3125, "1": 3125}}, {"iot.telemetry.raw": {"0": 3130}}))
    assert kafka_records(report) is None
