"""``ingestion_gap``: one alert per raw topic whose whole input stops while devices were
reporting, cleared by the first records after it."""

from __future__ import annotations

from iotwatch.contract.alerts import AlertRecord
from iotwatch.settings import load_settings
from iotwatch.streaming.ingestion_gap import CLUSTER, IngestionGaps

T0 = 1_763_784_000_000


def gaps() -> tuple[IngestionGaps, list[AlertRecord]]:
    emitted: list[AlertRecord] = []
    settings = load_settings()
    settings = settings.model_copy(update={"stream": settings.stream.model_copy(update={"ingestion_gap_s": 30.0})})
    return IngestionGaps(settings, emitted.append), emitted


def test_an_outage_is_one_alert_raised_once_and_cleared_when_records_flow() -> None:
    monitor, emitted = gaps()
    raw = "iot.telemetry.raw"
    for second in range(10):
        monitor.batch({raw: 40}, devices_reporting=30, now_ms=T0 + second * 1000)
    for second in range(10, 130):  # Kafka down: no micro-batch at all
        monitor.tick(T0 + second * 1000)
    monitor.batch({raw: 3600}, devices_reporting=30, now_ms=T0 + 131_000)
    monitor.tick(T0 + 132_000)
    assert [(a.rule, a.state, a.site, a.device_type) for a in emitted] == [
        ("ingestion_gap", "raised", CLUSTER, "pipeline"),
        ("ingestion_gap", "cleared", CLUSTER, "pipeline"),
    ]
    raised, cleared = emitted
    assert raised.alert_id == cleared.alert_id and raised.detected_at_ms == T0 + 39_000
    assert "held" in raised.message and "after 122 s" in cleared.message
    assert raised.runbook_url and raised.runbook_url.endswith("ingestion_gap")


def test_a_site_is_its_own_scope_and_an_idle_start_or_a_fleet_that_said_goodbye_is_no_gap() -> None:
    monitor, emitted = gaps()
    monitor.tick(T0 + 600_000)  # nothing read yet: nothing expected
    monitor.batch({"site1.iot.telemetry.raw": 5, "site2.iot.telemetry.raw": 5}, devices_reporting=4, now_ms=T0)
    monitor.batch({"site1.iot.telemetry.raw": 5, "site2.iot.telemetry.raw": 0}, devices_reporting=2, now_ms=T0 + 20_000)
    monitor.tick(T0 + 31_000)
    assert [(a.site, a.state) for a in emitted] == [("site2", "raised")]
    monitor.batch({"site1.iot.telemetry.raw": 2}, devices_reporting=0, now_ms=T0 + 40_000)  # the last goodbyes
    monitor.tick(T0 + 400_000)
    assert [(a.site, a.state) for a in emitted] == [("site2", "raised")]
