"""The demo's live view says of Kafka what the gateways' metrics say, and nothing they did not."""

from __future__ import annotations

from iotwatch.application.demo.live import kafka_note
from iotwatch.application.harness.probe import GATEWAY_COUNTERS


def test_kafka_state_comes_from_the_gateways_kafka_up_metric() -> None:
    # the scrape keeps kafka_up: without it every frame said "kafka DOWN" while gateway.json said up
    assert "kafka_up" in GATEWAY_COUNTERS
    assert kafka_note({"answered": 1, "kafka_up": 1}) == "kafka up"
    assert kafka_note({"answered": 1, "kafka_up": 0}) == "kafka DOWN"
    assert kafka_note({"answered": 3, "kafka_up": 2}) == "kafka DOWN at 1 of 3 gateways"
    assert kafka_note({"answered": 0}) == "gateway not answering"  # stopped at the end of the run
