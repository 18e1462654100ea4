"""``foreachBatch``: route one micro-batch's output rows to every sink, in two Spark jobs.

1. Everything but the readings -- alerts and dead letters to Kafka, aggregates and alert
   points to InfluxDB, the per-partition tallies -- in one pass on the executors, each task
   returning a few counts (no bulk data reaches the driver);
2. the readings to the Parquet archive.

Order matters for at-least-once: alerts and dead letters reach Kafka and the archive is
written before Spark commits the batch. A failure fails the batch, which Spark re-runs from
the same offsets and state, reproducing the same rows (alert ids are deterministic, dead
letters carry their source offsets, archive files are overwritten per batch). InfluxDB
holds derived data: its failures are counted, they do not fail the batch.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from iotwatch.clients.influx import InfluxV1Client
from iotwatch.deadletter import DeadLetter
from iotwatch.errors import IotwatchError
from iotwatch.settings import InfluxSettings, Settings
from streaming.sinks.influx_points import aggregate_point, alert_point, pipeline_point
from streaming.sinks.kafka_rows import produce_all

log = logging.getLogger(__name__)

#: Per-device counters (streaming.device_state.CORE_FIELDS) summed per batch -> their names in totals.
TALLY_FIELDS = {"received": "received", "scored": "reading_records", "duplicates": "duplicate", "late": "late",
                "dead_lettered": "dlq", "clock_steps": "clock_steps", "seq_resets": "seq_resets",
                "no_device": "no_device"}

_SUMMARY = "summary string"


def route_side_effects(kafka_config: dict[str, str], topics: tuple[str, str], influx: InfluxSettings | None,
                       batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side of job 1 (``mapInArrow``): write one task's alerts, dead letters and
    aggregates; yield one row of counts."""
    counts: Counter[str] = Counter()
    alerts_topic, dlq_topic = topics
    for batch in batches:
        if not batch.num_rows:
            continue
        kind = batch.column("kind")
        for name in ("alert", "aggregate", "dlq", "late"):
            counts[f"rows_{name}"] += pc.sum(pc.equal(kind, name)).as_py() or 0
        for body in batch.filter(pc.equal(kind, "tally")).column("body").to_pylist():
            counts.update(json.loads(body))
        alerts = [json.loads(b) for b in batch.filter(pc.equal(kind, "alert")).column("body").to_pylist()]
        if alerts:
            produce_all(kafka_config, alerts_topic, ((a["device_id"].encode(), json.dumps(a).encode(),
                                                      [("alert_id", a["alert_id"].encode())]) for a in alerts))
            counts["alerts_raised"] += sum(a["state"] == "raised" for a in alerts)
            counts["alerts_cleared"] += sum(a["state"] == "cleared" for a in alerts)
        letters = batch.filter(pc.is_in(kind, pa.array(["dlq", "late"]))).to_pylist()
        if letters:
            produce_all(kafka_config, dlq_topic, (_dead_letter(row) for row in letters))
        if influx is not None:
            points = [aggregate_point(row) for row in batch.filter(pc.equal(kind, "aggregate")).to_pylist()]
            points += [alert_point(a) for a in alerts]
            counts["influx_write_failures"] += _write_influx(influx, points)
    yield pa.RecordBatch.from_pylist([{"summary": json.dumps(counts)}])


def _dead_letter(row: dict[str, Any]) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    body = json.loads(row["body"])
    key = row["device_id"].encode() if row["device_id"] else None
    letter = DeadLetter(body["reason"], body["detail"], "stream", bytes(row["raw"] or b""), key)
    source = [("kafka.partition", str(row["kafka_partition"]).encode()),
              ("kafka.offset", str(row["kafka_offset"]).encode())]
    return key, letter.original, letter.headers(source)


def _write_influx(settings: InfluxSettings, points: list[Any]) -> int:
    """Metrics are derived data (recomputable from the archive): a failed write is logged
    and counted, it does not stop the pipeline. Returns the failed writes (0 or 1)."""
    if not points:
        return 0
    client = InfluxV1Client(settings)
    try:
        for start in range(0, len(points), 5000):
            client.write_points(points[start:start + 5000])
        return 0
    except IotwatchError as exc:
        log.warning("aggregates not written to InfluxDB: %s", exc)
        return 1
    finally:
        client.close()


class BatchWriter:
    """The ``foreachBatch`` function; keeps running totals for summaries and benchmarks."""

    def __init__(self, settings: Settings, archive_dir: Path) -> None:
        self.settings = settings
        self.kafka_config = settings.kafka.client_config()
        self.archive_path = str(Path(archive_dir).expanduser().resolve() / "readings")
        self.influx = settings.influx if settings.influx.enabled else None
        self.detector = settings.stream.device_detector
        self.totals: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.last_batch: dict[str, Any] = {}

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        started = time.time()
        frame = frame.persist()
        try:
            counts = self._write(frame, batch_id)
        finally:
            frame.unpersist()
        counts["batch_duration_ms"] = int((time.time() - started) * 1000)
        with self.lock:
            self.totals.update({k: v for k, v in counts.items() if k != "batch_duration_ms"})
            self.totals["batches"] += 1
            self.last_batch = {"batch_id": batch_id, **counts}
        if self.influx is not None:
            self._write_influx_health(counts, batch_id)

    def _write(self, frame: DataFrame, batch_id: int) -> dict[str, int]:
        config, topics = self.kafka_config, (self.settings.topics.alerts, self.settings.topics.dlq)
        influx = self.influx
        summaries = (frame.where(F.col("kind") != "reading")
                     .mapInArrow(lambda batches: route_side_effects(config, topics, influx, batches), _SUMMARY)
                     .collect())
        raw: Counter[str] = Counter()
        for row in summaries:
            raw.update(json.loads(row.summary))
        counts = {label: int(raw.get(name, 0)) for name, label in TALLY_FIELDS.items()}
        counts["reading"] = counts["reading_records"]
        counts["alert"], counts["aggregate"] = int(raw.get("rows_alert", 0)), int(raw.get("rows_aggregate", 0))
        for name in ("alerts_raised", "alerts_cleared", "influx_write_failures"):
            counts[name] = int(raw.get(name, 0))
        if counts["reading"]:
            self._archive(frame.where(F.col("kind") == "reading"), batch_id)
        return counts

    def _archive(self, readings: DataFrame, batch_id: int) -> None:
        """One row per reading -- metrics and detector scores as maps -- partitioned by date
        and device type. The batch id is the innermost partition and written with dynamic
        overwrite, so a re-run batch replaces its own files instead of duplicating them."""
        pairs = F.arrays_zip(F.col("names").alias("name"), F.col("scores").alias("score"),
                             F.col("out_of_range").alias("oor"))
        (readings
         .withColumn("event_time", F.timestamp_millis("event_ms"))
         .select("device_id", "site", "seq", "event_ms", "event_time",
                 F.map_from_arrays("names", "values").alias("metrics"),
                 F.map_from_entries(F.transform(F.filter(pairs, lambda p: ~F.isnan(p["score"])),
                                                lambda p: F.struct(p["name"], p["score"]))).alias("scores"),
                 F.transform(F.filter(pairs, lambda p: p["oor"]), lambda p: p["name"]).alias("out_of_range"),
                 F.lit(self.detector).alias("detector"),
                 F.date_format("event_time", "yyyy-MM-dd").alias("date"), "device_type",
                 F.lit(batch_id).alias("batch_id"))
         .write.mode("overwrite").partitionBy("date", "device_type", "batch_id").parquet(self.archive_path))

    def _write_influx_health(self, counts: dict[str, int], batch_id: int) -> None:
        assert self.influx is not None
        fields = {f"{name}": int(value) for name, value in counts.items()}
        fields["batch_id"] = batch_id
        if _write_influx(self.influx, [pipeline_point(fields, int(time.time() * 1000))]):
            with self.lock:
                self.totals["influx_write_failures"] += 1
