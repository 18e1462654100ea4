"""``iotwatch bench simulate``: is the simulator the bottleneck? It publishes the same payloads
as a bare paho loop (``raw_paho``) and as its own transport over pre-serialised payloads
(``raw_batch``), then runs the large fleet (:mod:`.fleet`); docs/benchmarks.md says how and
against which goals."""

from __future__ import annotations

import multiprocessing as mp
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from iotwatch.application.bench.fleet import fleet_run
from iotwatch.application.bench.record import machine
from iotwatch.application.bench.render import echo
from iotwatch.cli import AppContext, emit, json_option, pass_app
from iotwatch.devices.broker_run import RunOptions, run
from iotwatch.devices.config import SimConfig
from iotwatch.devices.simulation import Simulation
from iotwatch.settings import MqttSettings

__all__ = ["bench_simulate"]

_START_MS = 1_763_784_000_000
GOAL_RATIO = 0.9


def _config(homes: int, vehicles: int, count: int) -> SimConfig:
    return SimConfig(seed=7, homes=homes, vehicles=vehicles, count=count, start_ms=_START_MS)


def _ticks(config: SimConfig, shard: int, shards: int, quota: int) -> list[list[tuple[int, str, bytes]]]:
    """The shard's messages tick by tick, pre-serialised."""
    sim = Simulation(config, shard, shards, count_limit=quota)
    out: list[list[tuple[int, str, bytes]]] = []
    while not sim.exhausted:
        out.append([(uid, topic, payload.encode()) for uid, topic, payload, _ in sim.tick()])
    return out


@dataclass(frozen=True)
class _Share:
    """What one process of a raw measurement publishes, and how."""

    mqtt: MqttSettings
    config: SimConfig
    shard: int
    shards: int
    quota: int
    qos: int
    connections: int
    max_inflight: int

    def client_id(self, kind: str, n: int) -> str:
        return f"iotwatch-bench-{kind}-{self.shard}-{n}-{time.monotonic_ns()}"


def _batch_loop(share: _Share, barrier: Any) -> tuple[int, float]:
    """The simulator's transport over pre-serialised payloads, one write per connection and tick."""
    import threading

    from iotwatch.clients.batch_publish import BatchPublishClient
    from iotwatch.clients.mqtt import make_client

    mqtt, connections, qos = share.mqtt, share.connections, share.qos
    ticks = _ticks(share.config, share.shard, share.shards, share.quota)
    clients: list[BatchPublishClient] = []
    for n in range(connections):
        client = make_client(mqtt, share.client_id("batch", n), client_class=BatchPublishClient)
        assert isinstance(client, BatchPublishClient)
        client.window = share.max_inflight
        connected = threading.Event()
        client.on_connect = lambda *_, ready=connected: ready.set()
        client.connect(mqtt.host, mqtt.port, keepalive=mqtt.keepalive_s)
        client.loop_start()
        if not connected.wait(30):
            raise TimeoutError("no CONNACK within 30 s")
        clients.append(client)
    if qos:
        sys.setswitchinterval(0.0005)  # as the simulator does at QoS 1
    barrier.wait(timeout=120)
    started = time.monotonic()
    for tick in ticks:
        per_client: list[list[Any]] = [[] for _ in clients]
        for uid, topic, payload in tick:
            per_client[uid % connections].append((topic, payload, False))
        for client, messages in zip(clients, per_client, strict=True):
            if messages:
                client.publish_many(messages, qos)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(c.pending == 0 and c.written() for c in clients):
        time.sleep(0.002)
    wall = time.monotonic() - started
    for client in clients:
        client.disconnect()
        client.loop_stop()
    return sum(len(t) for t in ticks), wall


def _paho_loop(share: _Share, barrier: Any) -> tuple[int, float]:
    """A bare paho loop over pre-serialised payloads: the ceiling for Python + paho."""
    import threading

    from iotwatch.clients.mqtt import make_client

    mqtt, connections, qos = share.mqtt, share.connections, share.qos
    messages = [m for tick in _ticks(share.config, share.shard, share.shards, share.quota) for m in tick]
    clients = []
    acked = [0]
    lock = threading.Lock()

    def on_publish(*_: Any) -> None:
        with lock:
            acked[0] += 1

    for n in range(connections):
        client = make_client(mqtt, share.client_id("raw", n))
        client.max_inflight_messages_set(share.max_inflight)
        client.max_queued_messages_set(0)
        if qos:
            client.on_publish = on_publish
        client.connect(mqtt.host, mqtt.port, keepalive=mqtt.keepalive_s)
        client.loop_start()
        clients.append(client)
    barrier.wait(timeout=120)
    started = time.monotonic()
    for uid, topic, payload in messages:
        clients[uid % connections].publish(topic, payload, qos)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (acked[0] >= len(messages)) if qos else all(not c._out_packet for c in clients):
            break
        time.sleep(0.002)
    wall = time.monotonic() - started
    for client in clients:
        client.disconnect()
        client.loop_stop()
    return len(messages), wall


def _measure(loop: Any, share: _Share, barrier: Any, results: Any) -> None:
    """One worker process: ``loop`` (``_paho_loop`` or ``_batch_loop``) -> (sent, wall) or the error."""
    try:
        sent, wall = loop(share, barrier)
        results.put((share.shard, sent, wall, None))
    except BaseException as exc:
        results.put((share.shard, 0, 0.0, f"{type(exc).__name__}: {exc}"))


def _raw(
    loop: Any, mqtt: MqttSettings, config: SimConfig, processes: int, qos: int, connections: int, max_inflight: int
) -> dict[str, Any]:
    """``loop`` in ``processes`` processes at once, each with its share of the messages."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    count = config.count or 0
    shares = [
        _Share(mqtt, config, s, processes, count // processes + (s < count % processes), qos, connections, max_inflight)
        for s in range(processes)
    ]
    workers = [ctx.Process(target=_measure, args=(loop, share, barrier, results)) for share in shares]
    for worker in workers:
        worker.start()
    parts = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
    errors = [p[3] for p in parts if p[3]]
    if errors:
        raise RuntimeError(f"raw publishing benchmark failed: {errors[0]}")
    sent = sum(p[1] for p in parts)
    wall = max(p[2] for p in parts)
    return {"sent": sent, "wall_s": round(wall, 3), "rate": round(sent / wall, 1)}


@click.command("simulate")
@click.option(
    "--mqtt",
    "mqtt_url",
    metavar="mqtt://HOST:PORT",
    help="Broker to measure against (default: start a private mosquitto).",
)
@click.option("--messages", type=click.IntRange(min=1000), default=100_000, help="Messages per measurement.")
@click.option("--processes", type=click.IntRange(min=1), default=2)
@click.option("--connections", type=click.IntRange(min=1), default=2, help="MQTT connections per process.")
@click.option("--homes", type=click.IntRange(min=0), default=2000)
@click.option("--vehicles", type=click.IntRange(min=0), default=100)
@click.option(
    "--qos",
    "qos_levels",
    type=click.Choice(["0", "1"]),
    multiple=True,
    help="QoS levels to measure (repeatable) [default: 0 and 1].",
)
@click.option("--max-inflight", type=click.IntRange(min=1), default=200)
@click.option(
    "--fleet-devices",
    type=click.IntRange(min=0),
    default=100_000,
    help="Devices of the large-fleet run in one process (0: skip it).",
)
@click.option(
    "--fleet-interval",
    type=click.FloatRange(min=0.1),
    default=10.0,
    help="Seconds between two readings of a device in the large-fleet run.",
)
@click.option(
    "--fleet-duration",
    type=click.FloatRange(min=1.0),
    default=30.0,
    help="Seconds of the large-fleet run (real time).",
)
@json_option
@pass_app
def bench_simulate(
    app: AppContext,
    mqtt_url: str | None,
    messages: int,
    processes: int,
    connections: int,
    homes: int,
    vehicles: int,
    qos_levels: tuple[str, ...],
    max_inflight: int,
    fleet_devices: int,
    fleet_interval: float,
    fleet_duration: float,
    as_json: bool,
) -> None:
    """Simulator msg/s vs a bare paho loop and its own transport with the same payloads."""
    from iotwatch.application.stack.mqtt_broker import start_mqtt_broker
    from iotwatch.application.stack.process import stop_process
    from iotwatch.settings import normalise_mqtt_url

    if homes + vehicles == 0:
        raise click.UsageError("nothing to simulate: --homes or --vehicles must be > 0")
    levels = [int(q) for q in (qos_levels or ("0", "1"))]
    run_dir = tempfile.TemporaryDirectory(prefix="iotwatch-bench-sim-")
    broker = None if mqtt_url else start_mqtt_broker(Path(run_dir.name), "mosquitto", timeout_s=30.0)
    url = broker.endpoint if broker else normalise_mqtt_url(mqtt_url or "")
    mqtt = MqttSettings(url=url) if broker else app.settings.mqtt.model_copy(update={"url": url})
    config = _config(homes, vehicles, messages)
    result: dict[str, Any] = {
        "broker": mqtt.url,
        "own_broker": broker is not None,
        "messages": messages,
        "processes": processes,
        "connections_per_process": connections,
        "homes": homes,
        "vehicles": vehicles,
        "machine": machine(),
        "results": {},
    }
    try:
        for qos in levels:
            options = RunOptions(
                mqtt=mqtt,
                qos=qos,
                processes=processes,
                connections=connections,
                as_fast_as_possible=True,
                max_inflight=max_inflight,
            )
            summary = run(config, options)
            simulator = {
                "sent": summary["sent"],
                "wall_s": summary["wall_s"],
                "rate": summary["achieved_rate"],
                "errors": summary["errors"],
                "publish_latency": summary["publish_latency"],
            }
            raw = _raw(_paho_loop, mqtt, config, processes, qos, connections, max_inflight)
            batch = _raw(_batch_loop, mqtt, config, processes, qos, connections, max_inflight)
            entry: dict[str, Any] = {
                "simulator": simulator,
                "raw_paho": raw,
                "ratio_vs_raw_paho": round(simulator["rate"] / raw["rate"], 3),
                "raw_batch": batch,
                "ratio_vs_raw_batch": round(simulator["rate"] / batch["rate"], 3),
            }
            result["results"][f"qos{qos}"] = entry
        if fleet_devices:
            result["fleet"] = fleet_run(mqtt, fleet_devices, fleet_interval, fleet_duration)
    finally:
        if broker is not None:
            stop_process(broker.process)
        run_dir.cleanup()
    result["goal_ratio"] = GOAL_RATIO
    met = [e["ratio_vs_raw_paho"] >= GOAL_RATIO for e in result["results"].values()]
    if fleet_devices:
        fleet = result["fleet"]
        met += [fleet["on_schedule"], fleet["within_memory"], fleet["every_device_gap_free"]]
    result["meets_goal"] = all(met)
    emit(result, as_json, echo("simulate"))
