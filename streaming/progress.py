"""What the job did, batch by batch: Spark's query progress plus the stateful operator's
tallies, kept as running totals, logged, and written to InfluxDB's ``pipeline`` measurement
(docs/streaming-internals.md, "Progress and totals").
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from iotwatch.clients.influx import OutageLog
from iotwatch.settings import Settings
from iotwatch.streaming.schemas import TALLY_FIELDS, WORKER_STEP_LABELS
from iotwatch.streaming.sinks.influx_points import pipeline_point, write_derived

if TYPE_CHECKING:
    from iotwatch.streaming.ingestion_gap import IngestionGaps

log = logging.getLogger(__name__)

#: The name of the observation that collects the tallies of a micro-batch (summed on the driver).
OBSERVATION = "tally"
#: Progress reports kept for summaries and benchmarks (the oldest are dropped).
HISTORY = 10_000
#: How often the reporter reads the query's progress (Spark keeps the last 100 reports:
#: ``spark.sql.streaming.numRecentProgressUpdates``).
POLL_S = 0.2
#: At most one progress line this often (the gateway's status period): a micro-batch every
#: second or two is a line every second or two otherwise, and an outage's or a restart's
#: lines drown in them. Each line covers the micro-batches with records since the last.
LINE_EVERY_S = 10.0


def now_ms() -> int:
    return int(time.time() * 1000)


def tally_sums() -> list[Column]:
    """The observation's column: the batch's tally arrays, summed on the driver (:func:`batch_counts`)."""
    return [F.collect_list("counts").alias("counts")]


def _offsets(value: Any) -> dict[str, dict[str, int]] | None:
    """A source's offsets in a progress event (JSON text or already parsed)."""
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except (TypeError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _records_per_topic(progress: Any, since: str, until: str) -> dict[str, int] | None:
    """Records between two of each source's offsets (``startOffset``, ``endOffset``,
    ``latestOffset``) in a progress report, per topic over its partitions; None when a
    source lacks one of them."""
    out: dict[str, int] = {}
    for source in progress.sources:
        start, end = _offsets(getattr(source, since)), _offsets(getattr(source, until))
        if start is None or end is None:
            return None
        for topic, partitions in end.items():
            begun = start.get(topic, {})
            moved = sum(max(0, int(offset) - int(begun.get(partition, 0))) for partition, offset in partitions.items())
            out[topic] = out.get(topic, 0) + moved
    return out


def records_by_topic(progress: Any, received: int) -> dict[str, int]:
    """Kafka records the batch read per topic (a query's first batch, which has no start
    offsets: ``received`` for each topic it read)."""
    found = _records_per_topic(progress, "startOffset", "endOffset")
    if found is not None:
        return found
    return {topic: received for source in progress.sources for topic in _offsets(source.endOffset) or {}}


def kafka_lag(progress: Any) -> int | None:
    """Records between what the last batch read and the log end, over all partitions."""
    found = _records_per_topic(progress, "endOffset", "latestOffset")
    return None if found is None else sum(found.values())


def kafka_records(progress: Any) -> int | None:
    """Kafka records the batch read (its offset ranges), whatever rows the source made of
    them; None for a query's first micro-batch, whose report has no start offsets (it starts
    at the initial offsets, which only the checkpoint holds: counting from 0 would count a
    topic's whole history for a job that starts at its end)."""
    found = _records_per_topic(progress, "startOffset", "endOffset")
    return None if found is None else sum(found.values())


#: Tallies that measure a micro-batch rather than count events: what its state writes held
#: (bytes, and devices in the shards written). Summed over batches they are no count of
#: anything a user knows, so the totals carry their sums under names that say so
#: (``state_bytes_written``, ``state_device_writes``) and ``last`` the last batch's values.
BATCH_GAUGES = {"state_bytes": "state_bytes_written", "state_devices": "state_device_writes"}
#: Tallies that are states of the partitions a batch touched, not counts: kept out of the
#: totals (``devices_reporting``: devices neither silent nor gone offline; ``silence_held``:
#: devices past the silence timeout whose partition's input stopped too).
PARTITION_GAUGES = ("devices_reporting", "silence_held")


def batch_counts(observed: Any) -> dict[str, int]:
    """The observation's row (None for a batch that emitted nothing) as the totals' counters:
    the sums of its tally arrays (:data:`iotwatch.streaming.schemas.TALLY_SCHEMA`)."""
    arrays = [row for row in (getattr(observed, "counts", None) or []) if row is not None]
    sums = np.sum(np.asarray(arrays, dtype=np.int64), axis=0) if arrays else np.zeros(len(TALLY_FIELDS), np.int64)
    counts = {label: int(total) for label, total in zip(TALLY_FIELDS.values(), sums.tolist(), strict=True)}
    counts["reading"] = counts["reading_records"]
    counts["alert"] = counts["alerts_raised"] + counts["alerts_cleared"]
    return counts


def progress_line(batch_id: int, records: int, rate: float, lag: int | None, batch_ms: int, batches: int = 1) -> str:
    """Micro-batches up to ``batch_id`` as one line, in the gateway's ``name=value`` style:
    their records, processing rate, the Kafka lag left and the longest batch's duration."""
    more = f" batches={batches}" if batches > 1 else ""
    return (
        f"stream: batch={batch_id}{more} records={records} rate={rate:,.0f}/s "
        f"lag={'?' if lag is None else lag} batch_ms={batch_ms}"
    )


@dataclass
class _LinePeriod:
    """The micro-batches with records since the last progress line."""

    batches: int = 0
    records: int = 0
    trigger_ms: int = 0
    longest_ms: int = 0
    logged_at: float = float("-inf")  # monotonic time of the last line

    def add(self, records: int, trigger_ms: int) -> None:
        self.batches += 1
        self.records += records
        self.trigger_ms += trigger_ms
        self.longest_ms = max(self.longest_ms, trigger_ms)

    def due(self, now: float) -> bool:
        return self.batches > 0 and now - self.logged_at >= LINE_EVERY_S


class ProgressReporter:
    """Running totals and per-batch history of one query, its log lines and its ``pipeline``
    points, from the query's progress reports (:meth:`follow` reads them in a thread)."""

    def __init__(self, settings: Settings, query_name: str, gaps: IngestionGaps | None = None) -> None:
        self.influx = settings.influx if settings.influx.enabled else None
        self.gaps = gaps
        self._influx_outage = OutageLog(log, "pipeline health")
        self.query_name = query_name
        self.lock = threading.Lock()
        self.totals: Counter[str] = Counter()
        self.last: dict[str, Any] = {}
        self.last_batch_id = -1
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        #: Where each micro-batch's time went (Spark's ``durationMs``: addBatch, queryPlanning,
        #: walCommit, ...; the Python worker's steps inside addBatch, ``worker_ms_*``), with its
        #: Kafka records, in batch order.
        self.phases: deque[dict[str, int]] = deque(maxlen=HISTORY)
        self._query: StreamingQuery | None = None
        self._period = _LinePeriod()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, query: StreamingQuery) -> None:
        """Read ``query``'s progress every :data:`POLL_S` until :meth:`close`."""
        self._query = query
        self._thread = threading.Thread(target=self._run, name=f"progress-{self.query_name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.poll()
                if self.gaps is not None:
                    self.gaps.tick(now_ms())
            except Exception as exc:
                log.debug("reading the query's progress: %s", str(exc).splitlines()[0] if str(exc) else exc)

    def poll(self) -> None:
        """Count every report newer than the last one counted, in order (thread-safe)."""
        query = self._query
        if query is None:
            return
        with self.lock:
            last = query.lastProgress
            if last is None or last.batchId <= self.last_batch_id:
                return
            reports = [last] if last.batchId == self.last_batch_id + 1 else query.recentProgress
            fresh = [p for p in reports if p.batchId > self.last_batch_id]
            if fresh and fresh[0].batchId > self.last_batch_id + 1 and self.last_batch_id >= 0:
                log.warning(
                    "progress of micro-batches %d-%d was not read in time: the totals miss them",
                    self.last_batch_id + 1,
                    fresh[0].batchId - 1,
                )
            for progress in fresh:
                self.record(progress)

    def close(self) -> None:
        """Read what is left, then stop following."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.poll()

    def record(self, progress: Any) -> None:
        """Count one micro-batch's progress report (in batch order)."""
        counts = batch_counts(progress.observedMetrics.get(OBSERVATION))
        records = kafka_records(progress)
        if records is None:
            records = counts["received"]  # the operator receives every record the batch read
        trigger_ms = int(progress.durationMs.get("triggerExecution", 0))
        rows = int(progress.numInputRows)
        rate, lag = records * 1000 / trigger_ms if trigger_ms else 0.0, kafka_lag(progress)
        fields: dict[str, float | int | None] = {
            "input_rows": records,  # Kafka records, not Spark rows (the source packs records in chunks)
            "input_rows_per_s": float(progress.inputRowsPerSecond or 0.0) * records / rows if rows else 0.0,
            "processed_rows_per_s": rate,
            "trigger_ms": trigger_ms,
            "lag_records": lag,
            "state_rows": int(sum(op.numRowsTotal for op in progress.stateOperators)),
            "state_memory_bytes": int(sum(op.memoryUsedBytes for op in progress.stateOperators)),
        }
        if self.gaps is not None:
            self.gaps.batch(records_by_topic(progress, counts["received"]), counts["devices_reporting"], now_ms())
        self.totals.update(
            {BATCH_GAUGES.get(name, name): value for name, value in counts.items() if name not in PARTITION_GAUGES}
        )
        self.totals["batches"] += 1
        fields.update({f"{name}_written": counts[name] for name in BATCH_GAUGES})
        self.last = fields
        self.last_batch_id = int(progress.batchId)
        self.history.append(fields)
        self.phases.append(
            {
                "records": records,
                **{k: int(v) for k, v in progress.durationMs.items()},
                **{label: counts[label] for label in WORKER_STEP_LABELS},
            }
        )
        self._log_line(int(progress.batchId), records, trigger_ms, fields)
        if self.influx is not None:
            self._write_influx(fields, {**counts, "batch_duration_ms": trigger_ms, "batch_id": int(progress.batchId)})

    def _log_line(self, batch_id: int, records: int, trigger_ms: int, fields: dict[str, Any]) -> None:
        """Every micro-batch at DEBUG; at INFO, one line per :data:`LINE_EVERY_S` covering the
        batches with records since the last (the first at once), none while nothing flows."""
        log.debug(
            "%s", progress_line(batch_id, records, fields["processed_rows_per_s"], fields["lag_records"], trigger_ms)
        )
        if not records:
            return
        period = self._period
        period.add(records, trigger_ms)
        now = time.monotonic()
        if not period.due(now):
            return
        rate = period.records * 1000 / period.trigger_ms if period.trigger_ms else 0.0
        line = progress_line(batch_id, period.records, rate, fields["lag_records"], period.longest_ms, period.batches)
        log.info("%s", line)
        self._period = _LinePeriod(logged_at=now)

    def _write_influx(self, progress: dict[str, Any], batch: dict[str, int]) -> None:
        assert self.influx is not None
        at = now_ms()
        points = [pipeline_point(batch, at), pipeline_point(progress, at, stage="stream_progress")]
        lines = [point.to_line_protocol() for point in points]
        self.totals["influx_write_failures"] += write_derived(self.influx, self._influx_outage, lines)
