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


class _Progress:
    """A ``StreamingQueryProgress`` of a micro-batch that read ``records`` Kafka records."""

    def __init__(self, batch_id: int, records: int, offset: int) -> None:
        raw = "iot.telemetry.raw"
        self.batchId, self.numInputRows, self.inputRowsPerSecond = batch_id, records, 0.0
        self.sources = [_source({raw: {"0": offset}}, {raw: {"0": offset + records}}, {raw: {"0": offset + records}})]
        self.observedMetrics: dict[str, Any] = {}
        self.durationMs = {"triggerExecution": 500}
        self.stateOperators: list[Any] = []


def test_progress_lines_come_every_few_seconds_while_records_flow_and_not_when_nothing_does(
    caplog: Any, monkeypatch: Any
) -> None:
    """A micro-batch a second is one INFO line per ``LINE_EVERY_S`` covering the batches since
    the last (the first at once); batches without records add none; every batch at DEBUG."""
    import logging

    from iotwatch.settings import load_settings
    from iotwatch.streaming import progress as progress_module
    from iotwatch.streaming.progress import LINE_EVERY_S, ProgressReporter, progress_line

    settings = load_settings()
    reporter = ProgressReporter(
        settings.model_copy(update={"influx": settings.influx.model_copy(update={"url": None})}), "q"
    )
    now = [0.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    offset = 0
    with caplog.at_level(logging.DEBUG, logger=progress_module.__name__):
        for batch in range(60):  # 30 s with 10 records a second, then 30 s with none (Kafka down)
            records = 10 if batch < 30 else 0
            now[0] = float(batch)
            reporter.record(_Progress(batch + 1, records, offset))
            offset += records
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(info) == 30 // LINE_EVERY_S and sum(r.levelno == logging.DEBUG for r in caplog.records) == 60
    assert info[0] == progress_line(1, 10, 20.0, 0, 500)
    assert info[1] == progress_line(int(LINE_EVERY_S) + 1, 100, 20.0, 0, 500, batches=int(LINE_EVERY_S))
    assert reporter.totals["batches"] == 60


def test_a_batch_counts_the_sum_of_its_partitions_tallies() -> None:
    """The observation collects one tally array per partition and call (as a progress report's
    JSON gives them: lists of numbers); the driver sums them under the totals' names."""
    from pyspark.sql import Row

    from iotwatch.streaming.operator_rows import tally_row
    from iotwatch.streaming.progress import batch_counts

    rows = [tally_row(0, {"received": 5, "alerts_raised": 1}), tally_row(3, {"received": 7, "ms_engine": 4})]
    observed = Row(counts=[row["counts"][0].tolist() for row in rows])
    counts = batch_counts(observed)
    assert (counts["received"], counts["alerts_raised"], counts["worker_ms_engine"], counts["alert"]) == (12, 1, 4, 1)
    assert batch_counts(None)["received"] == 0 == batch_counts(Row(counts=[]))["received"]
