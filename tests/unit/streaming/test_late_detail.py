"""A late record's dead letter says when, in UTC, not in epoch milliseconds."""

from __future__ import annotations

from iotwatch.streaming.sorted_batch import late_detail


def test_a_late_dead_letter_gives_utc_times_and_how_late() -> None:
    assert late_detail(1_763_784_000_000, 1_763_784_300_000, 120_000) == (
        "event time 2025-11-22T04:00:00.000Z is 300.0 s older than the device's newest "
        "2025-11-22T04:05:00.000Z (allowed lateness 120 s)"
    )
