"""An InfluxDB outage is logged as it starts, once a minute while it lasts and as it ends,
not once for every write (writers write every micro-batch, several times a second)."""

from __future__ import annotations

import logging

import pytest

from iotwatch.clients.influx import OutageLog
from iotwatch.errors import ServiceUnavailable


def test_an_outage_is_logged_at_its_start_every_minute_and_at_its_end(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    outage = OutageLog(logging.getLogger("test.writer"), "pipeline health", every_s=60.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="test.writer")
    error = ServiceUnavailable("InfluxDB at http://127.0.0.1:1 refused the connection")

    outage.written()  # nothing to say while InfluxDB answers
    for second in range(0, 150):  # a write every 0.5 s for 150 s
        for half in (0.0, 0.5):
            now[0] = second + half
            outage.failed(error)
    now[0] = 150.0
    outage.written()
    outage.written()

    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        ("WARNING", f"pipeline health not written to InfluxDB (the pipeline goes on): {error}"),
        ("WARNING", f"pipeline health still not written to InfluxDB after 60 s (121 failed writes): {error}"),
        ("WARNING", f"pipeline health still not written to InfluxDB after 120 s (241 failed writes): {error}"),
        ("INFO", "pipeline health written to InfluxDB again after 150 s (300 failed writes)"),
    ]
    now[0] = 200.0
    outage.failed(error)  # a new outage starts its own count
    assert caplog.records[-1].getMessage().startswith("pipeline health not written") and outage.failures == 1
