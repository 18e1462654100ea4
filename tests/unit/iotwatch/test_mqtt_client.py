"""The MQTT clients' own arithmetic: batched PUBACK bytes as paho writes them, and the bounded
latency sample of the batch publisher (no broker: tests/integration/iotwatch/test_mqtt_client.py
runs both clients against one)."""

from __future__ import annotations

import pytest

from iotwatch.clients.batch_publish import BatchPublishClient


def test_ack_many_writes_the_bytes_of_paho_pubacks() -> None:
    import struct

    import paho.mqtt.client as paho

    from iotwatch.clients.mqtt import _PUBACK_HEADER

    mids = [1, 2, 300, 65535]
    batched = struct.pack(f"!{len(mids)}I", *(_PUBACK_HEADER | mid for mid in mids))
    assert batched == b"".join(struct.pack("!BBH", paho.PUBACK, 2, mid) for mid in mids)


def test_batch_publish_keeps_a_bounded_uniform_sample_of_latencies(monkeypatch: pytest.MonkeyPatch) -> None:
    from paho.mqtt.enums import CallbackAPIVersion

    from iotwatch.clients import batch_publish

    monkeypatch.setattr(batch_publish, "LATENCY_SAMPLES", 100)
    client = BatchPublishClient(CallbackAPIVersion.VERSION2)
    for value in range(10_000):
        client._keep_latency(float(value))
    assert client.timed == 10_000 and len(client.latencies_ms) == 100
    # a uniform sample of 0..9999, not the first hundred: its mean is near 5,000
    assert 3_500 < sum(client.latencies_ms) / 100 < 6_500
