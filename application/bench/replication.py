"""``iotwatch bench replication``: MirrorMaker 2 between sites and the centre against a plain
consumer of each site's own topic, in the same run (docs/benchmarks.md says how)."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click
from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

from iotwatch.application.bench.render import echo
from iotwatch.application.stack import EmbeddedStack
from iotwatch.application.stack.mirror_maker import remote_topic
from iotwatch.application.stack.replication import LagHistory, ReplicationLag
from iotwatch.cli import AppContext, emit, json_option, pass_app
from iotwatch.clients.kafka import client_config, list_topics
from iotwatch.contract.telemetry import Telemetry
from iotwatch.settings import KafkaSettings
from iotwatch.stats import quantiles


class PathReader:
    """Follows a topic from its end (no group), recording each record's latency: read time
    minus the record's timestamp (its creation at the site)."""

    def __init__(self, kafka: KafkaSettings, topic: str) -> None:
        self.consumer = Consumer({**client_config(kafka), "group.id": "iotwatch-bench-replication"})
        partitions = list_topics(kafka)[topic]
        self.consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(partitions)])
        self.latencies_ms: list[float] = []
        self.keys: set[bytes] = set()
        self.first = self.last = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PathReader:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            for message in self.consumer.consume(5000, 0.2):
                if message.error() is not None:
                    continue
                now = time.time()
                self.first = self.first or now
                self.last = now
                self.latencies_ms.append(now * 1000 - message.timestamp()[1])
                self.keys.add(message.value() or b"")

    def close(self) -> dict[str, Any]:
        self.stop.set()
        self.thread.join(10)
        self.consumer.close()
        span = self.last - self.first
        return {
            "records": len(self.latencies_ms),
            "distinct": len(self.keys),
            "records_per_s": round(len(self.latencies_ms) / span, 1) if span > 0 else None,
            "latency_ms": quantiles(sorted(self.latencies_ms), (0.5, 0.99), digits=1),
        }


def produce_paced(kafka: KafkaSettings, topic: str, site: str, rate: float, seconds: float) -> int:
    """Readings into ``topic`` at ``rate`` a second for ``seconds``; returns how many."""
    producer = Producer({**client_config(kafka), "linger.ms": 5, "enable.idempotence": True})
    devices = [f"{site}-bench-{i}" for i in range(100)]
    started, sent = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        due = int((time.monotonic() - started) * rate)
        while sent < due:
            device = devices[sent % len(devices)]
            reading = Telemetry(
                v=1,
                device_id=device,
                device_type="thermostat",
                site=site,
                seq=sent // len(devices),
                ts=int(time.time() * 1000),
                metrics={"temperature_c": 21.0},
            )
            producer.produce(topic, reading.to_json(), key=device.encode())
            sent += 1
        producer.poll(0)
        time.sleep(0.002)
    assert producer.flush(60) == 0
    return sent


@click.command("replication")
@click.option("--sites", default=1, type=click.IntRange(min=1, max=4), help="Sites, each replicated.")
@click.option("--rate", default=5000.0, help="Readings per second into each site's raw topic.")
@click.option("--seconds", default=30.0, help="How long each site's producer runs.")
@click.option(
    "--work-dir", type=click.Path(file_okay=False, path_type=Path), help="Stack folder (default: a temporary one)."
)
@json_option
@pass_app
def bench_replication(
    app: AppContext, sites: int, rate: float, seconds: float, work_dir: Path | None, as_json: bool
) -> None:
    """MirrorMaker 2's throughput and added latency against a plain consumer of each site's topic."""
    with tempfile.TemporaryDirectory(prefix="iotwatch-bench-replication-") as tmp:
        stack_settings = app.settings.stack.model_copy(update={"sites": sites, "influxdb": "none"})
        embedded = EmbeddedStack(app.settings.model_copy(update={"stack": stack_settings}), work_dir or Path(tmp))
        state = embedded.up()
        try:
            result = _measure(app.settings.topics.raw, state, rate, seconds)
        finally:
            embedded.down()
    result["options"] = {"sites": sites, "rate_per_site": rate, "seconds": seconds}
    emit(result, as_json, echo("replication"))


def _measure(raw: str, state: Any, rate: float, seconds: float) -> dict[str, Any]:
    central = state.kafka_client(state.services["kafka"].endpoint)
    edges = {site: state.kafka_client(state.site_endpoints(site)["kafka"]) for site in state.sites}
    readers = {
        site: (PathReader(edge, raw).start(), PathReader(central, remote_topic(site, raw)).start())
        for site, edge in edges.items()
    }
    time.sleep(2.0)  # the readers have found their partitions' ends before the first record
    lag = ReplicationLag(central, state.sites)
    lags = LagHistory(state.sites)
    produced: dict[str, int] = {}
    producers = [
        threading.Thread(target=lambda s=site, e=edge: produced.__setitem__(s, produce_paced(e, raw, s, rate, seconds)))
        for site, edge in edges.items()
    ]
    for thread in producers:
        thread.start()
    while any(thread.is_alive() for thread in producers):
        lags.add(lag.sample())
        time.sleep(0.5)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(
        len(replicated.keys) < produced[site] for site, (_, replicated) in readers.items()
    ):
        lags.add(lag.sample())
        time.sleep(0.5)
    lag.close()
    result: dict[str, Any] = {"sites": {}}
    for site, (plain, replicated) in readers.items():
        raw_path, mirrored = plain.close(), replicated.close()
        added = {
            q: (
                None
                if mirrored["latency_ms"][q] is None or raw_path["latency_ms"][q] is None
                else round(mirrored["latency_ms"][q] - raw_path["latency_ms"][q], 1)
            )
            for q in mirrored["latency_ms"]
        }
        result["sites"][site] = {
            "produced": produced[site],
            "raw_path": raw_path,
            "replicated": {**mirrored, "duplicates": mirrored["records"] - mirrored["distinct"]},
            "replication_added_latency_ms": added,
            "replicated_over_raw_throughput": (
                round(mirrored["records_per_s"] / raw_path["records_per_s"], 3)
                if mirrored["records_per_s"] and raw_path["records_per_s"]
                else None
            ),
            "heartbeat_lag": lags.summary(site),
        }
    return result
