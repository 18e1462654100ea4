"""`iotwatch bench gateway` runs end to end and reports both paths from one run."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_bench_gateway_reports_raw_and_gateway_paths_as_json() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOTWATCH_")}
    result = subprocess.run([sys.executable, "-m", "iotwatch", "bench", "gateway", "--messages", "2000",
                             "--devices", "20", "--rate", "500", "--latency-seconds", "1", "--json"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    throughput = report["throughput"]
    assert throughput["raw"]["messages"] == throughput["gateway"]["messages"] == 2000
    assert throughput["gateway"]["gateway_summary"]["forwarded"] == 2000
    assert throughput["ratio"] == round(throughput["gateway_to_kafka_msgs_per_s"]
                                        / throughput["raw_mqtt_subscriber_msgs_per_s"], 3)
    latency = report["latency"]
    assert latency["messages"] == 500
    assert latency["gateway_publish_to_kafka_append_ms"]["p99"] is not None
    assert latency["raw_publish_to_subscriber_ms"]["p50"] is not None
