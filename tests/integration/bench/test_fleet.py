"""The large-fleet run of ``bench simulate``, small: one real-time process, a subscriber
that sees every device's seq from 0 gap-free, the tick lag and the peak RSS reported."""

from __future__ import annotations

from iotwatch.application.bench.fleet import fleet_run
from iotwatch.settings import Settings


def test_a_paced_fleet_arrives_gap_free_on_schedule(stack_settings: Settings) -> None:
    report = fleet_run(stack_settings.mqtt, devices=3000, interval_s=2.0, duration_s=6.0)
    sub = report["subscriber"]
    assert report["devices_per_process"] == 3000 and report["errors"] == 0
    assert report["target_rate"] == 1500.0
    # every device's phase lies within its first interval: 3 readings each in 6 s, then its goodbye
    assert report["sent"] == sub["received"] == 3000 * (3 + 1)
    assert sub["devices"] == sub["gap_free_devices"] == 3000
    assert sub["missing"] == sub["duplicates_or_reordered"] == sub["invalid"] == 0
    assert report["every_device_gap_free"]
    lag = report["tick_lag"]
    assert lag["ticks"] == 60 and 0 <= lag["p50_s"] <= lag["p99_s"] <= lag["max_s"]
    assert 0 < report["peak_rss_mb"] < 4096
