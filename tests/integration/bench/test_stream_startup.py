"""The start-up run of ``bench stream``: a job starting on a backlog that ends in a spike
per device alerts on every spike, and the run says how long that took."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from iotwatch.application.bench.stream import measure_startup
from iotwatch.settings import Settings


def test_a_job_starting_on_a_backlog_alerts_on_every_spike(
    spark: Any, test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    report = measure_startup(spark, test_settings, tmp_path, unique, devices=20)
    assert report["spikes_alerted"] == report["devices"] == 20
    first, last = report["start_to_alert_s"]["first"], report["start_to_alert_s"]["last"]
    assert 0 < first <= last < 300
    assert report["first_batch_ms"] > 0, report


def test_the_report_gives_each_detectors_state_and_cost_per_metric_reading() -> None:
    from iotwatch.application.bench.stream import detector_costs
    from iotwatch.settings import StreamSettings

    rows = detector_costs(StreamSettings(device_detectors={"air_quality": "cad_ose"}), readings=2_000)
    assert [(r["detector"], r["device_types"]) for r in rows] == [
        ("declared_levels", "every type not named"),
        ("cad_ose", ["air_quality"]),
    ]
    assert [r["state_bytes_per_metric"] for r in rows] == [416, 263_896]
    assert all(r["batch_ns_per_reading"] > 0 and r["class_ns_per_reading"] > 0 for r in rows)
