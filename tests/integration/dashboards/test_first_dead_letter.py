"""A gateway's first dead letter of a reason shows on the dead-letter panels (real InfluxDB 1.6):
the demo dead-lettered one message and reported the "Dead letters by reason" panel empty."""

from __future__ import annotations

import time
import uuid

from iotwatch.clients.influx import InfluxV1Client
from iotwatch.dashboards import build_all
from iotwatch.dashboards.queries import queries, substitute
from iotwatch.gateway.metrics import GatewayStats, influx_points
from iotwatch.settings import Settings


def test_one_dead_letter_shows_on_both_dead_letter_panels(stack_settings: Settings) -> None:
    influx = stack_settings.influx.model_copy(update={"database": f"dl_{uuid.uuid4().hex[:8]}"})
    client = InfluxV1Client(influx)
    client.create_database()
    try:
        stats = GatewayStats()
        stats.started_at = time.time() - 300  # the gateway started 5 minutes ago
        stats.received += 1
        stats.observe_delivery(0.004, "invalid_json")  # its one dead letter, in its one report
        client.write_points(influx_points(stats.snapshot(), "gw-1", int(time.time() * 1000)))
        model = build_all()["iotwatch-gateway.json"]
        found = dict(queries(model))
        values = {"instance": "gw-1", "site": "", "device": "", "metric": ""}
        (window,) = client.query(substitute(found["panel 'Dead letters by reason (time range)' A"], values))
        assert window["tags"] == {"reason": "invalid_json"} and window["values"][0][1] == 1
        (rate,) = client.query(substitute(found["panel 'Dead letters by reason' A"], values))
        assert any(value and value > 0 for _, value in rate["values"]), rate
    finally:
        client.query(f'DROP DATABASE "{influx.database}"', method="POST")
        client.close()
