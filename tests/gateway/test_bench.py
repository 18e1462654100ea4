"""`iotwatch bench gateway` runs end to end and reports both paths from one run."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_bench_gateway_reports_backlog_drain_and_latency_as_json() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOTWATCH_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "iotwatch",
            "bench",
            "gateway",
            "--messages",
            "2000",
            "--devices",
            "20",
            "--processes",
            "2",
            "--rate",
            "500",
            "--latency-seconds",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    drain = report["backlog_drain"]
    for n in ("1", "2"):
        run = drain[f"processes_{n}"]
        assert run["bare"]["messages"] == run["bare_buffered"]["messages"] == run["gateway"]["messages"] == 2000
        assert run["gateway"]["forwarded"] == 2000 and run["gateway"]["dead_lettered"] == 0
        assert run["ratio"] == round(run["gateway_msgs_per_s"] / run["bare_subscriber_msgs_per_s"], 3)
    assert drain["gateway_scaling"] is not None
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
