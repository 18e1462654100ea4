"""``foreachBatch``: the readings of one micro-batch to the Parquet archive, in one Spark job.

Alerts, dead letters and aggregates were written by the stateful operator itself
(:mod:`streaming.sinks.events`); what reaches this function is one row per scored reading
plus one ``tally`` row per partition. The tallies are summed by a Spark ``Observation`` on
the same job that writes the archive, so no second pass and no collect of readings.

Order matters for at-least-once: the archive is written before Spark commits the batch. A
failure fails the batch, which Spark re-runs from the same offsets and state, reproducing
the same rows; archive files are overwritten per batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from iotwatch.clients.influx import InfluxV1Client
from iotwatch.errors import IotwatchError
from iotwatch.settings import Settings
from streaming.schemas import SCORED_METRICS, WIDE_METRICS, score_column, value_column
from streaming.sinks.influx_points import pipeline_point

log = logging.getLogger(__name__)

#: Counters of the tally rows (see streaming.device_state.CORE_FIELDS and
#: streaming.sinks.events) -> their names in the job's totals.
TALLY_FIELDS = {"received": "received", "scored": "reading_records", "duplicates": "duplicate", "late": "late",
                "dead_lettered": "dlq", "clock_steps": "clock_steps", "seq_resets": "seq_resets",
                "no_device": "no_device", "alerts_raised": "alerts_raised", "alerts_cleared": "alerts_cleared",
                "aggregates": "aggregate", "influx_write_failures": "influx_write_failures",
                "state_bytes": "state_bytes", "state_devices": "state_devices"}


class BatchWriter:
    """The ``foreachBatch`` function; keeps running totals for summaries and benchmarks."""

    def __init__(self, settings: Settings, archive_dir: Path) -> None:
        self.settings = settings
        self.archive_path = str(Path(archive_dir).expanduser().resolve() / "readings")
        self.influx = settings.influx if settings.influx.enabled else None
        self.detector = settings.stream.device_detector
        self.totals: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.last_batch: dict[str, Any] = {}
        self._tally_columns: list[Any] | None = None
        self._archive_columns: list[Any] | None = None

    def _expressions(self) -> tuple[list[Any], list[Any]]:
        """The tally sums and the archive's columns, built once: each column expression is a
        round trip to the JVM, and there are about a hundred of them."""
        if self._tally_columns is None or self._archive_columns is None:
            tally = F.col("kind") == "tally"
            self._tally_columns = [F.count(F.lit(1)).alias("rows"), *[
                F.sum(F.when(tally, F.get_json_object("body", f"$.{name}").cast("long"))).alias(name)
                for name in TALLY_FIELDS]]
            self._archive_columns = self._archive_layout()
        return self._tally_columns, self._archive_columns

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        started = time.time()
        counts = self._write(frame, batch_id)
        counts["batch_duration_ms"] = int((time.time() - started) * 1000)
        with self.lock:
            self.totals.update({k: v for k, v in counts.items() if k != "batch_duration_ms"})
            self.totals["batches"] += 1
            self.last_batch = {"batch_id": batch_id, **counts}
        if self.influx is not None:
            self._write_influx_health(counts, batch_id)

    def _write(self, frame: DataFrame, batch_id: int) -> dict[str, int]:
        tally_columns, archive_columns = self._expressions()
        observation = Observation("tally")
        observed = frame.observe(observation, *tally_columns)
        # The batch id is a directory, not a column: a literal that changes every batch would
        # make Spark generate and compile the plan's code anew each time.
        (observed.where(F.col("kind") == "reading").select(*archive_columns)
         .write.mode("overwrite").partitionBy("date", "device_type")
         .parquet(f"{self.archive_path}/batch_id={batch_id}"))
        seen = observation.get
        counts = {label: int(seen.get(name) or 0) for name, label in TALLY_FIELDS.items()}
        counts["reading"] = counts["reading_records"]
        counts["alert"] = counts["alerts_raised"] + counts["alerts_cleared"]
        return counts

    def _archive_layout(self) -> list[Any]:
        """The archive's columns from a reading row: one row per reading -- metrics and
        detector scores as structs of the wide layout, uncatalogued metrics as maps --
        under ``batch_id=N/date=D/device_type=T/``. Each batch overwrites its own directory,
        so a re-run batch replaces its files instead of duplicating them."""
        extra_scores = F.filter(F.arrays_zip(F.col("extra_names").alias("name"), F.col("extra_scores").alias("score")),
                                lambda p: ~F.isnan(p["score"]))
        event_time = F.timestamp_millis("event_ms")
        return [
            "device_id", "site", "seq", "event_ms", event_time.alias("event_time"),
            F.struct(*[F.col(value_column(m)).alias(m) for m in WIDE_METRICS]).alias("metrics"),
            F.struct(*[F.col(score_column(m)).alias(m) for m in SCORED_METRICS]).alias("scores"),
            "out_of_range",
            F.when(F.col("extra_names").isNotNull(), F.map_from_arrays("extra_names", "extra_values"))
            .alias("extra_metrics"),
            F.when(F.col("extra_names").isNotNull(), F.map_from_entries(F.transform(
                extra_scores, lambda p: F.struct(p["name"], p["score"])))).alias("extra_scores"),
            F.lit(self.detector).alias("detector"), F.date_format(event_time, "yyyy-MM-dd").alias("date"),
            "device_type"]

    def _write_influx_health(self, counts: dict[str, int], batch_id: int) -> None:
        assert self.influx is not None
        fields = {f"{name}": int(value) for name, value in counts.items()}
        fields["batch_id"] = batch_id
        client = InfluxV1Client(self.influx)
        try:
            client.write_points([pipeline_point(fields, int(time.time() * 1000))])
        except IotwatchError as exc:
            with self.lock:
                self.totals["influx_write_failures"] += 1
            log.warning("pipeline health not written to InfluxDB (derived data; the pipeline goes on): %s", exc)
        finally:
            client.close()
