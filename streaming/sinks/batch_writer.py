"""``foreachBatch``: route one micro-batch's output rows to every sink.

Order matters for at-least-once: alerts and dead letters reach Kafka, the archive and
InfluxDB are written, and only then does Spark commit the batch. A failure anywhere fails
the batch, which Spark re-runs from the same offsets and state, reproducing the same rows.
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

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from iotwatch.clients.influx import InfluxV1Client
from iotwatch.deadletter import DeadLetter
from iotwatch.errors import IotwatchError
from iotwatch.settings import InfluxSettings, Settings
from streaming.sinks.influx_points import aggregate_point, alert_point, pipeline_point
from streaming.sinks.kafka_rows import produce_all

log = logging.getLogger(__name__)

#: Per-device counters (streaming.device_state.Counters) summed per batch -> their names in totals.
TALLY_FIELDS = {"received": "received", "scored": "reading_records", "duplicates": "duplicate", "late": "late",
                "dead_lettered": "dlq", "clock_steps": "clock_steps"}

def _dead_letters(kafka_config: dict[str, str], topic: str, rows: Iterator[Any]) -> None:
    def records() -> Iterator[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
        for row in rows:
            body = json.loads(row.body)
            key = row.device_id.encode() if row.device_id else None
            letter = DeadLetter(body["reason"], body["detail"], "stream", bytes(row.raw or b""), key)
            source = [("kafka.partition", str(row.kafka_partition).encode()),
                      ("kafka.offset", str(row.kafka_offset).encode())]
            yield key, letter.original, letter.headers(source)

    produce_all(kafka_config, topic, records())


def _influx_aggregates(settings: InfluxSettings, rows: Iterator[Any]) -> None:
    """Metrics are derived data (recomputable from the archive): an InfluxDB outage is
    logged, it does not stop the pipeline."""
    client = InfluxV1Client(settings)
    try:
        batch = []
        for row in rows:
            batch.append(aggregate_point(row))
            if len(batch) >= 5000:
                client.write_points(batch)
                batch = []
        client.write_points(batch)
    except IotwatchError as exc:
        log.warning("aggregates not written to InfluxDB: %s", exc)
    finally:
        client.close()


class BatchWriter:
    """The ``foreachBatch`` function; keeps running totals for summaries and benchmarks."""

    def __init__(self, settings: Settings, archive_dir: Path) -> None:
        self.settings = settings
        self.kafka_config = settings.kafka.client_config()
        self.archive_path = str(Path(archive_dir).expanduser().resolve() / "readings")
        self.influx = settings.influx if settings.influx.enabled else None
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
        tally = F.col("kind") == "tally"
        by_kind = {row["kind"]: row for row in frame.groupBy("kind").agg(
            F.count(F.lit(1)).alias("rows"),
            *[F.sum(F.when(tally, F.get_json_object("body", f"$.{name}").cast("long"))).alias(name)
              for name in TALLY_FIELDS]).collect()}
        counts: dict[str, int] = {kind: (by_kind[kind]["rows"] if kind in by_kind else 0)
                                  for kind in ("reading", "alert", "aggregate")}
        tallies = by_kind.get("tally")
        for name, label in TALLY_FIELDS.items():
            counts[label] = int(tallies[name] or 0) if tallies is not None else 0
        readings = frame.filter(F.col("kind") == "reading")

        alerts = [json.loads(row.body) for row in frame.filter(F.col("kind") == "alert").select("body").collect()]
        if alerts:
            produce_all(self.kafka_config, self.settings.topics.alerts,
                        ((a["device_id"].encode(), json.dumps(a).encode(), [("alert_id", a["alert_id"].encode())])
                         for a in alerts))
        counts["alerts_raised"] = sum(a["state"] == "raised" for a in alerts)
        counts["alerts_cleared"] = sum(a["state"] == "cleared" for a in alerts)

        if counts["dlq"] or counts["late"]:
            config, topic = self.kafka_config, self.settings.topics.dlq
            frame.filter(F.col("kind").isin("dlq", "late")).foreachPartition(
                lambda rows: _dead_letters(config, topic, rows))

        if counts["reading"]:
            self._archive(readings, batch_id)

        if self.influx is not None:
            if counts["aggregate"]:
                influx = self.influx
                frame.filter(F.col("kind") == "aggregate").foreachPartition(
                    lambda rows: _influx_aggregates(influx, rows))
            if alerts:
                self._influx_write([alert_point(a) for a in alerts])
        return counts

    def _archive(self, readings: DataFrame, batch_id: int) -> None:
        """Clean long-format readings, partitioned by date and device type. The batch id is
        the innermost partition and written with dynamic overwrite, so a re-run batch
        replaces its own files instead of duplicating them."""
        (readings
         .withColumn("event_time", F.timestamp_millis("event_ms"))
         .withColumn("date", F.date_format("event_time", "yyyy-MM-dd"))
         .withColumn("batch_id", F.lit(batch_id))
         .select("device_id", "site", "seq", "event_ms", "event_time", "metric", "value", "score", "detector",
                 "quality", "date", "device_type", "batch_id")
         .write.mode("overwrite").partitionBy("date", "device_type", "batch_id").parquet(self.archive_path))

    def _write_influx_health(self, counts: dict[str, int], batch_id: int) -> None:
        fields = {f"{name}": int(value) for name, value in counts.items()}
        fields["batch_id"] = batch_id
        self._influx_write([pipeline_point(fields, int(time.time() * 1000))])

    def _influx_write(self, points: list[Any]) -> None:
        assert self.influx is not None
        client = InfluxV1Client(self.influx)
        try:
            client.write_points(points)
        except IotwatchError as exc:
            with self.lock:
                self.totals["influx_write_failures"] += 1
            log.warning("metrics not written to InfluxDB (derived data; the pipeline goes on): %s", exc)
        finally:
            client.close()
