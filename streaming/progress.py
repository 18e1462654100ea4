"""What the job did, batch by batch: Spark's query progress plus the stateful operator's tallies.

The stateful operator writes every output itself (:mod:`streaming.sinks`) and emits one
tally row per partition; the query sums them with an observation
(:data:`OBSERVATION`), so each progress event carries the micro-batch's counts. This
listener keeps the running totals (what ``iotwatch stream`` prints, what the tests and
benchmarks read) and sends two points per micro-batch to InfluxDB's ``pipeline``
measurement: ``stage=stream`` (the counts and the batch duration) and
``stage=stream_progress`` (rates, Kafka lag, state size). It runs on Spark's listener
thread, off the micro-batch's path.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, deque
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

from iotwatch.clients.influx import InfluxV1Client
from iotwatch.errors import IotwatchError
from iotwatch.settings import Settings
from streaming.schemas import TALLY_FIELDS
from streaming.sinks.influx_points import pipeline_point

log = logging.getLogger(__name__)

#: The name of the observation that sums the tallies of a micro-batch.
OBSERVATION = "tally"
#: Progress events kept for summaries and benchmarks (the oldest are dropped).
HISTORY = 10_000


def tally_sums() -> list[Column]:
    """The observation's columns: one sum per tally counter."""
    return [F.sum(name).alias(name) for name in TALLY_FIELDS]


def _offsets(value: Any) -> dict[str, dict[str, int]] | None:
    """A source's offsets in a progress event (JSON text or already parsed)."""
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except (TypeError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _distance(since: dict[str, dict[str, int]] | None, until: dict[str, dict[str, int]] | None) -> int | None:
    """Records between two offset maps, over all partitions."""
    if since is None or until is None:
        return None
    return sum(max(0, int(offset) - int(since.get(topic, {}).get(partition, 0)))
               for topic, partitions in until.items() for partition, offset in partitions.items())


def kafka_lag(progress: Any) -> int | None:
    """Records between what the last batch read and the log end, over all partitions."""
    total = 0
    for source in progress.sources:
        lag = _distance(_offsets(source.endOffset), _offsets(source.latestOffset))
        if lag is None:
            return None
        total += lag
    return total


def kafka_records(progress: Any) -> int:
    """Kafka records the batch read (its offset ranges), whatever rows the source made of them."""
    return sum(_distance(_offsets(source.startOffset) or {}, _offsets(source.endOffset)) or 0
               for source in progress.sources)


def batch_counts(observed: Any) -> dict[str, int]:
    """The observation's row (None for a batch that emitted nothing) as the totals' counters."""
    seen = observed.asDict() if observed is not None else {}
    counts = {label: int(seen.get(name) or 0) for name, label in TALLY_FIELDS.items()}
    counts["reading"] = counts["reading_records"]
    counts["alert"] = counts["alerts_raised"] + counts["alerts_cleared"]
    return counts


class ProgressReporter(StreamingQueryListener):
    """Running totals and per-batch history of one query, and its ``pipeline`` points."""

    def __init__(self, settings: Settings, query_name: str) -> None:
        self.influx = settings.influx if settings.influx.enabled else None
        self.query_name = query_name
        self.lock = threading.Lock()
        self.totals: Counter[str] = Counter()
        self.last: dict[str, Any] = {}
        self.last_batch: dict[str, Any] = {}
        self.last_batch_id = -1
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if progress.name != self.query_name:
            return
        records = kafka_records(progress)
        trigger_ms = int(progress.durationMs.get("triggerExecution", 0))
        rows = int(progress.numInputRows)
        fields = {
            "input_rows": records,  # Kafka records, not Spark rows (the source packs records in chunks)
            "input_rows_per_s": float(progress.inputRowsPerSecond or 0.0) * records / rows if rows else 0.0,
            "processed_rows_per_s": records * 1000 / trigger_ms if trigger_ms else 0.0,
            "trigger_ms": trigger_ms,
            "lag_records": kafka_lag(progress),
            "state_rows": int(sum(op.numRowsTotal for op in progress.stateOperators)),
            "state_memory_bytes": int(sum(op.memoryUsedBytes for op in progress.stateOperators)),
        }
        counts = batch_counts(progress.observedMetrics.get(OBSERVATION))
        with self.lock:
            self.totals.update(counts)
            self.totals["batches"] += 1
            self.last = fields
            self.last_batch = {"batch_id": progress.batchId, **counts, "batch_duration_ms": trigger_ms}
            self.last_batch_id = int(progress.batchId)
            self.history.append(fields)
        if self.influx is not None:
            self._write_influx(fields, {**counts, "batch_duration_ms": trigger_ms, "batch_id": int(progress.batchId)})

    def _write_influx(self, progress: dict[str, Any], batch: dict[str, int]) -> None:
        """Metrics are derived data: a failed write is logged and counted, not fatal."""
        assert self.influx is not None
        now_ms = int(time.time() * 1000)
        client = InfluxV1Client(self.influx)
        try:
            client.write_points([pipeline_point(batch, now_ms), pipeline_point(progress, now_ms, stage="stream_progress")])
        except IotwatchError as exc:
            with self.lock:
                self.totals["influx_write_failures"] += 1
            log.warning("pipeline health not written to InfluxDB (derived data; the pipeline goes on): %s", exc)
        finally:
            client.close()

    def wait_for(self, batch_id: int, timeout_s: float = 10.0) -> bool:
        """Block until the progress of ``batch_id`` has been counted (listener events arrive
        asynchronously, after the batch); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.last_batch_id < batch_id and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.last_batch_id >= batch_id
