"""What a device keeps between micro-batches, field by field: the column layout of a
:class:`iotwatch.streaming.device_table.DeviceTable` row.

- ``core`` (int64, :data:`CORE_FIELDS`): sequence high-water mark, newest event time,
  wall and log times of the newest record, the accounting counters;
- ``seqs`` (uint64 words): a ring bitmap of the last ``dedup_window`` seqs, bit
  ``seq % window`` (duplicate detection);
- ``episodes`` (int64, one row per non-idle rule, :data:`EPISODE_FIELDS`) and their peak
  scores (float64): the alert lifecycle (idle rules keep nothing);
- ``metrics`` (names) with one detector state row each (float64, in the layout of the
  device detector's kernel, see :mod:`iotwatch.models.kernels`) and the metric's previous value
  (the fleet model's change features);
- ``buckets`` (float64 rows, :data:`BUCKET_FIELDS`): open event-time aggregates.
"""

from __future__ import annotations

#: int64 fields of a device's ``core`` row, by position.
CORE_FIELDS = (
    "seq_high",
    "max_event_ms",
    "last_wall_ms",
    "last_append_ms",
    "received",
    "scored",
    "duplicates",
    "late",
    "dead_lettered",
    "seq_resets",
    "clock_steps",
    "seq_gaps",
)
(
    SEQ_HIGH,
    MAX_EVENT_MS,
    LAST_WALL_MS,
    LAST_APPEND_MS,
    RECEIVED,
    SCORED,
    DUPLICATES,
    LATE,
    DEAD_LETTERED,
    SEQ_RESETS,
    CLOCK_STEPS,
    SEQ_GAPS,
) = range(len(CORE_FIELDS))
#: Counters summed into the job's totals (a subset of CORE_FIELDS).
COUNTERS = CORE_FIELDS[RECEIVED:]

#: int64 fields of one episode row (the alert lifecycle of one rule of one device); ``metric``
#: is the slot among the device's metrics of the metric the alert was raised on (-1: none),
#: so its clear speaks of the same metric.
EPISODE_FIELDS = ("rule", "status", "above", "below", "start_ms", "start_seq", "last_ms", "occurrences", "metric")
EP_RULE, EP_STATUS, EP_ABOVE, EP_BELOW, EP_START_MS, EP_START_SEQ, EP_LAST_MS, EP_OCCURRENCES, EP_METRIC = range(
    len(EPISODE_FIELDS)
)
IDLE, PENDING, OPEN = 0, 1, 2

#: float64 fields of one open aggregate bucket of one metric.
BUCKET_FIELDS = ("start_ms", "metric", "count", "sum", "min", "max", "last", "max_score")
