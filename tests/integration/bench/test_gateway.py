"""`iotwatch bench gateway` runs end to end and reports both paths from one run."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from iotwatch.application.stack import StackState
from tests.helpers import user_env


def _bench_gateway(*options: str, **env: str) -> dict[str, Any]:
    """``iotwatch bench gateway --json`` with small sizes, its report; ``env``: IOTWATCH_* to set."""
    environment = user_env()
    result = subprocess.run(
        [sys.executable, "-m", "iotwatch.application", "bench", "gateway", "--rate", "500", "--latency-seconds", "1"]
        + ["--kafka-warmup-seconds", "2", "--json"]
        + list(options),
        capture_output=True,
        text=True,
        env={**environment, **env},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_bench_gateway_reports_backlog_drain_and_latency_as_json() -> None:
    report = _bench_gateway("--messages", "2000", "--devices", "20", "--processes", "2")
    drain = report["backlog_drain"]
    for n in ("1", "2"):
        run = drain[f"processes_{n}"]
        assert run["bare"]["messages"] == run["bare_buffered"]["messages"] == run["gateway"]["messages"] == 2000
        assert run["gateway"]["forwarded"] == 2000 and run["gateway"]["dead_lettered"] == 0
        assert run["ratio"] == round(run["gateway_msgs_per_s"] / run["bare_subscriber_msgs_per_s"], 3)
    assert drain["gateway_scaling"] is not None
    # the broker was warmed up first: 2 s at 500/s, all read back by the warm-up's own consumer
    warmup = report["kafka_warmup"]
    assert warmup["seconds"] == 2 and warmup["records_sent"] >= 900
    assert warmup["records_read"] == warmup["records_sent"]
    latency = report["latency"]
    assert latency["gateway"]["received"] == 1000  # 1 s of warm-up, then 1 s counted
    assert latency["gateway"]["messages"] > 400 and latency["raw"]["messages"] > 400  # counted after warm-up
    assert latency["gateway_publish_to_kafka_readable_ms"]["p99"] is not None
    assert latency["raw_publish_to_subscriber_ms"]["p50"] is not None
    # the reference through the same two brokers without the gateway's own work
    assert latency["bare_bridge"]["received"] == 1000 and latency["bare_bridge"]["messages"] > 400
    bridge, gateway = (
        latency["bare_bridge_publish_to_kafka_readable_ms"],
        latency["gateway_publish_to_kafka_readable_ms"],
    )
    assert latency["added_over_bare_bridge_ms"]["p99"] == round(gateway["p99"] - bridge["p99"], 2)


def test_bench_gateway_measures_on_the_configured_kafka(stack: StackState) -> None:
    """--configured-kafka: on the Kafka cluster the settings name (here the test session's
    broker, as it would be the compose file's Apache Kafka), MQTT on the bench's own broker."""
    kafka = stack.endpoints()["kafka"] or ""
    report = _bench_gateway(
        "--configured-kafka",
        "--messages",
        "1000",
        "--devices",
        "10",
        "--processes",
        "1",
        IOTWATCH_KAFKA_BOOTSTRAP_SERVERS=kafka,
    )
    assert report["kafka_broker"] == kafka  # its own broker would be on another port
    assert report["mqtt_broker"] in ("mosquitto", "amqtt")
    run = report["backlog_drain"]["processes_1"]
    assert run["gateway"]["forwarded"] == run["gateway"]["messages"] == 1000
    assert report["latency"]["gateway"]["received"] == report["latency"]["bare_bridge"]["received"] == 1000
