"""``iotwatch bench gateway``: the gateway against the raw MQTT path, in one run.

Same broker, same publisher, same pre-serialised payloads:

(a) raw path: a bare paho subscriber (QoS 1) counts the messages;
(b) gateway path: ``iotwatch gateway`` (its own process) forwards them into Kafka and a
    consumer reads them back.

Reported: messages/s for both and their ratio, and latency p50/p99 from publish (the
payload's ``ts``) to the subscriber (raw) or to the Kafka record's timestamp, which the
gateway's producer stamps when it appends (gateway).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click
import msgspec
from confluent_kafka import Consumer, TopicPartition

from iotwatch.cli import AppContext, emit, json_option, pass_app
from iotwatch.clients.kafka import client_config, ensure_topics
from iotwatch.clients.mqtt import make_client
from iotwatch.contract import Telemetry, telemetry_topic
from iotwatch.settings import Settings
from iotwatch.stack import EmbeddedStack
from gateway.metrics import wait_healthy
from iotwatch.stack.process import free_port


def _payloads(devices: int, per_device: int, run: str) -> list[tuple[str, Telemetry]]:
    """Interleaved readings of ``devices`` devices (ts is overwritten at publish time)."""
    out = []
    for seq in range(per_device):
        for d in range(devices):
            device = f"bench-{run}-{d}"
            out.append((telemetry_topic("bench", "smart_meter", device),
                        Telemetry(v=1, device_id=device, device_type="smart_meter", site="bench", seq=seq,
                                  ts=0, metrics={"power_w": 230.0 + d, "voltage_v": 230.1, "current_a": 1.0})))
    return out


def _publish(settings: Settings, messages: list[tuple[str, Telemetry]], client_id: str, rate: float = 0.0) -> float:
    """Publish at QoS 1, paced at ``rate`` msg/s (0: as fast as the broker accepts); returns the start time."""
    client = make_client(settings.mqtt, client_id)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect(settings.mqtt.host, settings.mqtt.port)
    client.loop_start()
    started = time.time()
    info = None
    for index, (topic, reading) in enumerate(messages):
        if rate:
            delay = started + index / rate - time.time()
            if delay > 0:
                time.sleep(delay)
        body = msgspec.structs.replace(reading, ts=int(time.time() * 1000)).to_json()
        info = client.publish(topic, body, qos=1)
    if info is not None:
        info.wait_for_publish(120)
    client.disconnect()
    client.loop_stop()
    return started


def _quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    ordered = sorted(values)
    return {"p50": ordered[len(ordered) // 2], "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}


def measure_raw(settings: Settings, messages: list[tuple[str, Telemetry]], run: str, rate: float = 0.0
                ) -> dict[str, Any]:
    """A bare paho subscriber: the ceiling the broker and publisher allow."""
    received: list[float] = []
    latencies: list[float] = []
    done = threading.Event()
    subscribed = threading.Event()
    total = len(messages)

    def on_message(_c: Any, _u: Any, message: Any) -> None:
        now = time.time()
        received.append(now)
        latencies.append(now * 1000 - json.loads(message.payload)["ts"])
        if len(received) >= total:
            done.set()

    sub = make_client(settings.mqtt, f"bench-raw-{run}")
    sub.on_message = on_message
    sub.on_subscribe = lambda *_: subscribed.set()
    sub.connect(settings.mqtt.host, settings.mqtt.port)
    sub.loop_start()
    sub.subscribe("iot/bench/+/+/telemetry", qos=1)
    subscribed.wait(10)
    started = _publish(settings, messages, f"bench-pub-raw-{run}", rate)
    done.wait(300)
    sub.disconnect()
    sub.loop_stop()
    elapsed = (received[-1] - started) if received else float("nan")
    return {"messages": len(received), "seconds": round(elapsed, 3), "msgs_per_s": round(len(received) / elapsed, 1),
            "latency_ms": _quantiles(latencies)}


def measure_gateway(settings: Settings, messages: list[tuple[str, Telemetry]], run: str,
                    workdir: Path, rate: float = 0.0) -> dict[str, Any]:
    """``iotwatch gateway`` in its own process, read back from Kafka."""
    topic = f"bench.{run}.raw"
    ensure_topics(settings.kafka, [topic, f"bench.{run}.dlq"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOTWATCH_")}
    env.update(IOTWATCH_TOPIC_RAW=topic, IOTWATCH_TOPIC_DLQ=f"bench.{run}.dlq",
               IOTWATCH_TOPIC_MQTT_TELEMETRY_FILTER="iot/bench/+/+/telemetry")
    port = free_port()
    log = open(workdir / f"gateway-{run}.log", "wb")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "iotwatch", "--log-level", "WARNING", "gateway", "--mqtt", settings.mqtt.url,
         "--kafka", settings.kafka.bootstrap_servers, "--influx", "", "--client-id", f"bench-gw-{run}",
         "--metrics-port", str(port), "--json"], env=env, stdout=subprocess.PIPE, stderr=log)
    try:
        wait_healthy(port)
        consumer = Consumer({**client_config(settings.kafka), "group.id": f"bench-{run}",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(settings.kafka.partitions)])
        total, got, latencies, last = len(messages), 0, [], 0.0
        publisher = threading.Thread(target=lambda: starts.append(_publish(settings, messages, f"bench-pub-gw-{run}", rate)))
        starts: list[float] = []
        publish_began = time.time()
        publisher.start()
        deadline = time.monotonic() + 600
        while got < total and time.monotonic() < deadline:
            for record in consumer.consume(5000, 0.5):
                if record.error():
                    continue
                got += 1
                last = time.time()
                latencies.append(record.timestamp()[1] - json.loads(record.value())["ts"])
        publisher.join()
        consumer.close()
    finally:
        gateway.terminate()
        out, _ = gateway.communicate(timeout=60)
    summary = json.loads(out) if out.strip() else {}
    elapsed = last - (starts[0] if starts else publish_began)
    return {"messages": got, "seconds": round(elapsed, 3), "msgs_per_s": round(got / elapsed, 1) if got else 0.0,
            "latency_ms": _quantiles(latencies), "gateway_summary": summary}


@click.command("gateway")
@click.option("--messages", "total", default=40_000, show_default=True, help="Messages per path.")
@click.option("--devices", default=100, show_default=True, help="Devices the messages are spread over.")
@click.option("--rate", default=1000.0, show_default=True, help="Input rate (msg/s) of the latency phase.")
@click.option("--latency-seconds", default=10.0, show_default=True, help="Duration of the latency phase.")
@json_option
@pass_app
def bench_gateway(app: AppContext, total: int, devices: int, rate: float, latency_seconds: float,
                  as_json: bool) -> None:
    """Gateway throughput and added latency against a bare MQTT subscriber, same run.

    Throughput phase: the same messages published as fast as the broker accepts through
    each path. Latency phase: a paced publisher at --rate msg/s (latency under saturation
    only measures queueing). Starts its own embedded MQTT and Kafka brokers (no InfluxDB).
    """
    run = f"{int(time.time())}"
    messages = _payloads(devices, max(1, total // devices), run)
    paced = _payloads(devices, max(1, int(rate * latency_seconds) // devices), f"{run}l")
    with tempfile.TemporaryDirectory(prefix="iotwatch-bench-") as tmp:
        base = app.settings
        stack_settings = base.model_copy(update={"stack": base.stack.model_copy(update={"influxdb": "none"})})
        stack = EmbeddedStack(stack_settings, Path(tmp) / "stack")
        state = stack.up()
        try:
            settings = state.apply_to(base)
            raw = measure_raw(settings, messages, run)
            through_gateway = measure_gateway(settings, messages, run, Path(tmp))
            raw_paced = measure_raw(settings, paced, f"{run}l", rate)
            gateway_paced = measure_gateway(settings, paced, f"{run}l", Path(tmp), rate)
        finally:
            stack.down()
    for phase in (raw, through_gateway):
        phase.pop("latency_ms")  # queueing under saturation; the paced phase measures latency
    result = {
        "benchmark": "gateway",
        "messages": len(messages),
        "devices": devices,
        "mqtt_broker": state.services["mqtt"].implementation,
        "throughput": {
            "raw_mqtt_subscriber_msgs_per_s": raw["msgs_per_s"],
            "gateway_to_kafka_msgs_per_s": through_gateway["msgs_per_s"],
            "ratio": round(through_gateway["msgs_per_s"] / raw["msgs_per_s"], 3) if raw["msgs_per_s"] else None,
            "raw": raw,
            "gateway": through_gateway,
        },
        "latency": {
            "input_rate_msgs_per_s": rate,
            "messages": len(paced),
            "raw_publish_to_subscriber_ms": raw_paced["latency_ms"],
            "gateway_publish_to_kafka_append_ms": gateway_paced["latency_ms"],
            "added_ms": {q: (round(gateway_paced["latency_ms"][q] - raw_paced["latency_ms"][q], 2)
                             if gateway_paced["latency_ms"][q] is not None and raw_paced["latency_ms"][q] is not None
                             else None) for q in ("p50", "p99")},
            "gateway_delivery_ms": {q: gateway_paced["gateway_summary"].get(f"delivery_latency_ms_{q}")
                                    for q in ("p50", "p99")},
        },
        "cpu_count": os.cpu_count(),
    }
    emit(result, as_json, lambda r: click.echo(
        f"throughput: raw subscriber {r['throughput']['raw_mqtt_subscriber_msgs_per_s']:.0f} msg/s, "
        f"gateway->Kafka {r['throughput']['gateway_to_kafka_msgs_per_s']:.0f} msg/s, ratio {r['throughput']['ratio']}\n"
        f"latency at {rate:.0f} msg/s: raw p50/p99 {r['latency']['raw_publish_to_subscriber_ms']}, "
        f"gateway {r['latency']['gateway_publish_to_kafka_append_ms']}, added {r['latency']['added_ms']}"))
