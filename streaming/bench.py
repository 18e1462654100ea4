"""``iotwatch bench stream``: the streaming job against a plain consumer, same run.

Throughput: the same pre-loaded topic is read (a) by a bare confluent-kafka consumer that
JSON-parses every record -- the raw path -- and (b) by the whole job (parse, validate,
deduplicate, score, alert, archive, InfluxDB). Latency: at a stated input rate, readings
stamped with the current time carry injected spikes; latency is from a spike's event time
to the append time of its alert on the alert topic.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click
from confluent_kafka import Consumer, Producer, TopicPartition

from iotwatch.cli import AppContext, emit, json_option, pass_app
from iotwatch.clients.kafka import ensure_topics
from iotwatch.contract import Telemetry
from iotwatch.settings import Settings
from iotwatch.stack import EmbeddedStack

SPIKE_EVERY = 97  # readings per device between injected spikes (after the warm-up)


def _reading(device: int, seq: int, ts: int, rng: random.Random, spike: bool = False) -> Telemetry:
    temperature = 21.0 + rng.gauss(0, 0.2) + (8.0 if spike else 0.0)
    return Telemetry(v=1, device_id=f"bench-th-{device}", device_type="thermostat", site=f"bench-{device % 10}",
                     seq=seq, ts=ts, metrics={"temperature_c": temperature, "humidity_pct": 45 + rng.gauss(0, 0.5),
                                              "setpoint_c": 21.0, "hvac_on": 0.0})


def preload(settings: Settings, topic: str, devices: int, per_device: int) -> int:
    producer = Producer({**settings.kafka.client_config(), "linger.ms": 20})
    rng = random.Random(1)
    t0 = int(time.time() * 1000) - per_device * 1000
    for seq in range(per_device):
        for device in range(devices):
            message = _reading(device, seq, t0 + seq * 1000, rng)
            producer.produce(topic, key=message.device_id.encode(), value=message.to_json())
        producer.poll(0)
    producer.flush(60)
    return devices * per_device


def measure_consumer(settings: Settings, topic: str, total: int) -> dict[str, Any]:
    """The raw path: read and JSON-parse every record."""
    consumer = Consumer({**settings.kafka.client_config(), "group.id": f"bench-raw-{time.time_ns()}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(settings.kafka.partitions)])
    started, count = time.monotonic(), 0
    deadline = started + 600
    while count < total and time.monotonic() < deadline:
        for message in consumer.consume(10_000, 0.5):
            if message.error() is None:
                json.loads(message.value())
                count += 1
    elapsed = time.monotonic() - started
    consumer.close()
    return {"records": count, "seconds": round(elapsed, 3), "records_per_s": round(count / elapsed, 1)}


def measure_job(settings: Settings, workdir: Path, total: int) -> dict[str, Any]:
    """The whole job over the backlog (availableNow), Spark start-up excluded."""
    from iotwatch.spark import session_scope
    from streaming.job import STREAM_CONF, start

    stream = settings.stream
    with session_scope("iotwatch-bench-stream", stream.spark_master, shuffle_partitions=stream.shuffle_partitions,
                       conf=STREAM_CONF) as spark:
        spark.range(1).count()  # JVM and Python workers warm, so start-up is not counted
        started = time.monotonic()
        job = start(spark, settings, checkpoint_dir=workdir / "ck-throughput", archive_dir=workdir / "archive",
                    available_now=True, query_name="bench_throughput")
        job.await_backlog(1800)
        elapsed = time.monotonic() - started
    records = int(job.writer.totals.get("reading_records", 0))
    # Steady state: batches after the first (which also pays query planning and worker start-up).
    later = [b for b in job.reporter.history[1:] if b["input_rows"]]
    steady_rows, steady_ms = sum(b["input_rows"] for b in later), sum(b["trigger_ms"] for b in later)
    return {"records": records, "seconds": round(elapsed, 3), "records_per_s": round(records / elapsed, 1),
            "steady_state_records_per_s": round(steady_rows / steady_ms * 1000, 1) if steady_ms else None,
            "batch_ms": [b["trigger_ms"] for b in job.reporter.history if b["input_rows"]],
            "batches": int(job.writer.totals.get("batches", 0)), "totals": dict(job.writer.totals)}


def measure_latency(settings: Settings, workdir: Path, rate: float, seconds: float, devices: int) -> dict[str, Any]:
    """Alerts for injected spikes at a steady input rate: spike event time -> alert append time."""
    from iotwatch.spark import session_scope
    from streaming.job import STREAM_CONF, start

    stream = settings.stream
    stop = threading.Event()
    spikes: dict[str, set[int]] = {}

    def produce() -> None:
        producer = Producer({**settings.kafka.client_config(), "linger.ms": 1})
        rng = random.Random(2)
        seq, started = 0, time.monotonic()
        warmup = int(stream.device_detector_params.get("warmup", 60)) + int(
            stream.device_detector_params.get("learning_period", 0)) + 5
        while not stop.is_set():
            for device in range(devices):
                spike = seq > warmup and (seq + device) % SPIKE_EVERY == 0
                message = _reading(device, seq, int(time.time() * 1000), rng, spike)
                if spike:
                    spikes.setdefault(message.device_id, set()).add(message.ts)
                producer.produce(settings.topics.raw, key=message.device_id.encode(), value=message.to_json())
            producer.poll(0)
            seq += 1
            delay = started + seq * devices / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        producer.flush(30)

    with session_scope("iotwatch-bench-stream", stream.spark_master, shuffle_partitions=stream.shuffle_partitions,
                       conf=STREAM_CONF) as spark:
        job = start(spark, settings, checkpoint_dir=workdir / "ck-latency", archive_dir=workdir / "archive-latency",
                    query_name="bench_latency")
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        time.sleep(seconds)
        stop.set()
        producer.join()
        time.sleep(3 * max(stream.trigger_interval_s, 1.0))
        job.stop()
    latencies = []
    consumer = Consumer({**settings.kafka.client_config(), "group.id": f"bench-lat-{time.time_ns()}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(settings.topics.alerts, p, 0) for p in range(settings.kafka.partitions)])
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < 3:
        for message in consumer.consume(1000, 0.5):
            idle_since = time.monotonic()
            if message.error():
                continue
            alert = json.loads(message.value())
            if alert["state"] == "raised" and alert["first_event_ms"] in spikes.get(alert["device_id"], ()):
                latencies.append(message.timestamp()[1] - alert["first_event_ms"])
    consumer.close()
    latencies.sort()
    injected = sum(len(v) for v in spikes.values())
    quantile = (lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else None)
    return {"input_rate_records_per_s": rate, "seconds": seconds, "devices": devices, "spikes_injected": injected,
            "spikes_alerted": len(latencies), "latency_ms": {"p50": quantile(0.5), "p99": quantile(0.99)},
            "trigger_interval_s": stream.trigger_interval_s}


@click.command("stream")
@click.option("--records", default=60_000, show_default=True, help="Pre-loaded records for the throughput phase.")
@click.option("--devices", default=200, show_default=True, help="Devices the records are spread over.")
@click.option("--rate", default=500.0, show_default=True, help="Input rate (records/s) of the latency phase.")
@click.option("--latency-seconds", default=40.0, show_default=True, help="Duration of the latency phase.")
@click.option("--trigger", "trigger_s", default=1.0, show_default=True, help="Micro-batch interval, latency phase.")
@json_option
@pass_app
def bench_stream(app: AppContext, records: int, devices: int, rate: float, latency_seconds: float,
                 trigger_s: float, as_json: bool) -> None:
    """Records/s through the streaming job against a plain consumer, and alert latency.

    Starts its own embedded Kafka-protocol broker and InfluxDB (when installed).
    """
    run = str(int(time.time()))
    base = app.settings
    with tempfile.TemporaryDirectory(prefix="iotwatch-bench-stream-") as tmp:
        stack = EmbeddedStack(base, Path(tmp) / "stack")
        state = stack.up()
        try:
            settings = state.apply_to(base)
            topics = settings.topics.model_copy(update={"raw": f"bench.{run}.raw", "dlq": f"bench.{run}.dlq",
                                                        "alerts": f"bench.{run}.alerts"})
            stream = settings.stream.model_copy(update={"max_offsets_per_trigger": 10_000,
                                                        "trigger_interval_s": trigger_s})
            settings = settings.model_copy(update={"topics": topics, "stream": stream})
            ensure_topics(settings.kafka, topics.kafka_topics())
            total = preload(settings, topics.raw, devices, max(1, records // devices))
            raw = measure_consumer(settings, topics.raw, total)
            job = measure_job(settings, Path(tmp), total)
            latency_settings = settings.model_copy(update={"topics": topics.model_copy(update={
                "raw": f"bench.{run}.live", "alerts": f"bench.{run}.live-alerts"})})
            ensure_topics(settings.kafka, [latency_settings.topics.raw, latency_settings.topics.alerts])
            latency = measure_latency(latency_settings, Path(tmp), rate, latency_seconds, min(devices, 50))
        finally:
            stack.down()
    result = {
        "benchmark": "stream",
        "records": total,
        "devices": devices,
        "throughput": {
            "plain_consumer_records_per_s": raw["records_per_s"],
            "job_records_per_s": job["records_per_s"],
            "ratio": round(job["records_per_s"] / raw["records_per_s"], 4) if raw["records_per_s"] else None,
            "job_steady_state_records_per_s": job["steady_state_records_per_s"],
            "plain_consumer": raw,
            "job": job,
        },
        "latency": latency,
        "spark_master": settings.stream.spark_master,
        "cpu_count": os.cpu_count(),
    }
    emit(result, as_json, lambda r: click.echo(
        f"throughput: plain consumer {r['throughput']['plain_consumer_records_per_s']:.0f} rec/s, job "
        f"{r['throughput']['job_records_per_s']:.0f} rec/s (ratio {r['throughput']['ratio']})\n"
        f"alert latency at {rate:.0f} rec/s: p50 {latency['latency_ms']['p50']} ms, p99 {latency['latency_ms']['p99']} "
        f"ms ({latency['spikes_alerted']}/{latency['spikes_injected']} spikes alerted)"))
