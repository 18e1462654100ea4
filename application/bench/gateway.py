"""``iotwatch bench gateway``: the gateway's ceiling (backlog drain) and added latency against
the raw MQTT path, on a warm Kafka broker, one run; docs/benchmarks.md says how each path is
measured."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import queue
import tempfile
import threading
import time
import zlib
from array import array
from collections.abc import Iterator
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import click
import msgspec
from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from iotwatch.application.bench.render import echo
from iotwatch.application.harness.pipeline import iotwatch_command
from iotwatch.application.stack import EmbeddedStack
from iotwatch.application.stack.process import Component, free_port
from iotwatch.cli import AppContext, Preset, emit, json_option, latency_options, pass_app
from iotwatch.clients.kafka import client_config, ensure_topics, read_to_end
from iotwatch.clients.mqtt import make_client
from iotwatch.contract.device_topics import telemetry_topic
from iotwatch.contract.telemetry import Telemetry
from iotwatch.gateway.metrics import scrape, wait_healthy
from iotwatch.settings import MqttSettings, Settings
from iotwatch.stats import quantiles

#: Messages a publisher may have unacknowledged (paho's packet ids wrap at 65,535).
_PUBLISH_WINDOW = 5000
#: Publisher processes.
_PUBLISHERS = 2
#: A paced publisher sleeps only when it is this far ahead, and sends what falls due
#: meanwhile back to back: a sleep per message (5,000 wake-ups a second) would keep the
#: publishers busy in the scheduler and take CPU from the paths they measure.
_PACING_S = 0.001


def _payloads(devices: int, per_device: int, site: str) -> list[tuple[str, Telemetry]]:
    """Interleaved readings of ``devices`` devices of one site (ts is set at publish time)."""
    metrics = [{"power_w": 230.0 + d, "voltage_v": 230.1, "current_a": 1.0} for d in range(devices)]
    return [
        (
            telemetry_topic(site, "smart_meter", f"{site}-{d}"),
            Telemetry(v=1, device_id=f"{site}-{d}", device_type="smart_meter", site=site, seq=seq, ts=0, metrics=m),
        )
        for seq in range(per_device)
        for d, m in enumerate(metrics)
    ]


def _publish_share(
    mqtt: MqttSettings, messages: list[tuple[str, Telemetry]], client_id: str, rate: float, start: Any
) -> None:
    """Publish at QoS 1 once every publisher is connected (``start``: a barrier of them all and
    the caller), paced at ``rate`` msg/s (0: as fast as the broker accepts); ``ts`` is stamped
    at publish time."""
    # the share lives to the end: a collection walking it would hold a message between its
    # stamp and its send, and show as latency of whichever path is measured
    gc.freeze()
    client = make_client(mqtt, client_id)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect(mqtt.host, mqtt.port)
    client.loop_start()
    start.wait(120)
    start_at = time.time()
    info = None
    for index, (topic, reading) in enumerate(messages):
        if rate:
            delay = start_at + index / rate - time.time()
            if delay > _PACING_S:
                time.sleep(delay)
        body = msgspec.structs.replace(reading, ts=int(time.time() * 1000)).to_json()
        info = client.publish(topic, body, qos=1)
        while info.rc:  # not taken (disconnected): publish it again
            time.sleep(0.05)
            info = client.publish(topic, body, qos=1)
        # as fast as accepted, wait for the broker now and then (paho's queue is unbounded);
        # paced, never: the wait stalls the pacing, and the burst that catches up afterwards
        # queues at the subscriber (a 40 ms latency spike every window in the raw path's p99)
        if not rate and index % _PUBLISH_WINDOW == _PUBLISH_WINDOW - 1:
            info.wait_for_publish(120)
    if info is not None:
        info.wait_for_publish(120)
    client.disconnect()
    client.loop_stop()


def _publish(
    mqtt: MqttSettings,
    messages: list[tuple[str, Telemetry]],
    client_id: str,
    rate: float = 0.0,
    publishers: int = _PUBLISHERS,
) -> float:
    """Publish from ``publishers`` processes (one Python publisher falls short of 5,000 msg/s
    on a busy machine), each with the devices of its share in order; returns the start time."""
    shares = [[m for m in messages if zlib.crc32(m[0].encode()) % publishers == i] for i in range(publishers)]
    shares = [share for share in shares if share]
    context = multiprocessing.get_context("spawn")
    # all begin together once connected, however long their processes took to start
    start = context.Barrier(len(shares) + 1)
    workers = [
        context.Process(
            target=_publish_share, args=(mqtt, share, f"{client_id}-{i}", rate * len(share) / len(messages), start)
        )
        for i, share in enumerate(shares)
    ]
    for worker in workers:
        worker.start()
    start.wait(120)
    started = time.time()
    for worker in workers:
        worker.join()
    return started


def _rate(count: int, first: float, last: float) -> float:
    return round((count - 1) / (last - first), 1) if count > 1 and last > first else 0.0


# -- warm-up ----------------------------------------------------------------------------------


def _plain_producer(settings: Settings) -> Producer:
    """A stock producer with the gateway's linger, and none of its other work."""
    return Producer({**client_config(settings.kafka), "linger.ms": settings.gateway.linger_ms})


def _reader(settings: Settings, topic: str, offset: int) -> Consumer:
    """A consumer of every partition of ``topic`` from ``offset`` that asks the broker to
    answer a fetch within 5 ms when nothing is there."""
    consumer = Consumer(
        {
            **client_config(settings.kafka),
            "group.id": f"bench-{topic}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5,
        }
    )
    consumer.assign([TopicPartition(topic, p, offset) for p in range(settings.kafka.partitions)])
    return consumer


#: Seconds of paced produce and fetch that warm the Kafka broker up before the runs: a broker
#: fresh from start runs its small-request path interpreted until its JIT has compiled it, and
#: a deployed broker is warm (docs/benchmarks.md).
KAFKA_WARMUP_S = 20.0


def warm_kafka(settings: Settings, rate: float, seconds: float = KAFKA_WARMUP_S) -> dict[str, int]:
    """Produce small records at ``rate`` a second for ``seconds`` with the gateway's linger
    while a consumer fetches them as the latency runs' reader does, then read the rest back;
    returns the records sent and read (equal unless the broker lost some)."""
    topic = "bench.warmup"
    ensure_topics(settings.kafka, [topic])
    producer = _plain_producer(settings)
    # the reader starts at the log's end as it is now, so it reads every record sent below
    # however late its first fetch comes
    consumer = _reader(settings, topic, OFFSET_END)
    ends = [
        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
        for p in range(settings.kafka.partitions)
    ]
    consumer.assign([TopicPartition(topic, p, end) for p, end in enumerate(ends)])
    started, sent, read = time.monotonic(), 0, 0

    def fetch() -> None:
        nonlocal read
        # the reader's own poll: one record at a time as they become readable
        for record in iter(lambda: consumer.poll(0), None):
            read += record.error() is None

    while (elapsed := time.monotonic() - started) < seconds:
        while sent < elapsed * rate:
            producer.produce(topic, b"{}", str(sent % 100).encode())
            sent += 1
        producer.poll(0)
        fetch()
        time.sleep(_PACING_S)
    producer.flush(10)
    deadline = time.monotonic() + 30
    while read < sent and time.monotonic() < deadline:
        fetch()
        time.sleep(_PACING_S)
    consumer.close()
    return {"records_sent": sent, "records_read": read}


# -- backlog drain ---------------------------------------------------------------------------


def _session(
    mqtt: MqttSettings,
    client_id: str,
    mqtt_filter: str,
    receive_maximum: int,
    on_message: Any = None,
    buffered_reads: bool = False,
) -> Any:
    """A connected MQTT 5 client on a persistent session subscribed to ``mqtt_filter``."""
    client = make_client(mqtt, client_id, protocol="5", buffered_reads=buffered_reads)
    subscribed = threading.Event()
    client.on_subscribe = lambda *_: subscribed.set()
    client.on_message = on_message
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 3600
    properties.ReceiveMaximum = receive_maximum
    client.connect(mqtt.host, mqtt.port, clean_start=False, properties=properties)
    client.subscribe(mqtt_filter, qos=1)
    client.loop_start()
    if not subscribed.wait(15):
        raise TimeoutError(f"{client_id}: no SUBACK")
    return client


def _bare_drain(
    mqtt: MqttSettings,
    client_id: str,
    mqtt_filter: str,
    receive_maximum: int,
    idle_s: float,
    buffered_reads: bool,
    results: Queue[tuple[int, float, float]],
) -> None:
    """A bare subscriber process: resume the session, count until idle, report (count, first, last)."""
    stamps = [0, 0.0, 0.0]

    def on_message(_c: Any, _u: Any, _m: Any) -> None:
        now = time.time()
        if not stamps[0]:
            stamps[1] = now
        stamps[0] += 1
        stamps[2] = now

    client = _session(mqtt, client_id, mqtt_filter, receive_maximum, on_message, buffered_reads)
    while not stamps[0] or time.time() - stamps[2] < idle_s:
        time.sleep(0.1)
    client.disconnect()
    client.loop_stop()
    results.put((int(stamps[0]), stamps[1], stamps[2]))


def drain_bare(
    mqtt: MqttSettings,
    messages: list[tuple[str, Telemetry]],
    site: str,
    processes: int,
    receive_maximum: int,
    buffered_reads: bool = False,
) -> dict[str, Any]:
    """Backlog drained by ``processes`` bare subscribers (one shared subscription when > 1);
    ``buffered_reads``: on the gateway's own MQTT client, to see the broker's own ceiling."""
    mqtt_filter = f"iot/{site}/+/+/telemetry" if processes == 1 else f"$share/{site}/iot/{site}/+/+/telemetry"
    ids = [f"{site}-bare-{i}" for i in range(processes)]
    for client_id in ids:  # create the sessions, then leave them offline
        client = _session(mqtt, client_id, mqtt_filter, receive_maximum)
        client.disconnect()
        client.loop_stop()
    _publish(mqtt, messages, f"{site}-pub")
    context = multiprocessing.get_context("spawn")
    results: Queue[tuple[int, float, float]] = context.Queue()
    workers = [
        context.Process(
            target=_bare_drain, args=(mqtt, client_id, mqtt_filter, receive_maximum, 3.0, buffered_reads, results)
        )
        for client_id in ids
    ]
    for worker in workers:
        worker.start()
    reports = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join(30)
    count = sum(r[0] for r in reports)
    first = min(r[1] for r in reports if r[0])
    last = max(r[2] for r in reports if r[0])
    return {
        "processes": processes,
        "messages": count,
        "seconds": round(last - first, 3),
        "msgs_per_s": _rate(count, first, last),
    }


def _gateway_process(
    settings: Settings, site: str, topic: str, processes: int, workdir: Path, name: str
) -> tuple[Component, list[int]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOTWATCH_")}
    env.update(settings.mqtt.as_environment() | settings.kafka.as_environment())  # credentials and TLS too
    env.update(
        IOTWATCH_TOPIC_RAW=topic,
        IOTWATCH_TOPIC_DLQ=f"{topic}.dlq",
        IOTWATCH_TOPIC_MQTT_TELEMETRY_FILTER=f"iot/{site}/+/+/telemetry",
    )
    port = free_port(count=processes)
    ports = [port + i for i in range(processes)]
    command = iotwatch_command(
        "gateway",
        "--influx",
        "",
        "--client-id",
        f"{site}-gw",
        "--metrics-port",
        str(port),
        "--processes",
        str(processes),
        "--json",
    )
    gateway = Component(name, command, env, workdir)
    try:
        for each in ports:
            wait_healthy(each)
    except TimeoutError as exc:
        gateway.kill()
        tail = gateway.log_path.read_text(errors="replace")[-3000:]
        raise TimeoutError(f"{exc} (exit status {gateway.process.returncode}); its log ends:\n{tail}") from None
    return gateway, ports


def _wait_confirmed(ports: list[int], expected: int, timeout_s: float = 600) -> None:
    """Until the gateways on ``ports`` report ``expected`` messages confirmed by Kafka
    (forwarded or dead-lettered), from their ``/metrics`` four times a second: reading the
    records back meanwhile would take a core's share from the drain it measures."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        scraped = [scrape(f"http://127.0.0.1:{port}/metrics") for port in ports]
        if sum(m.get("forwarded", 0) + m.get("dead_lettered", 0) for m in scraped) >= expected:
            return
        time.sleep(0.25)


def drain_gateway(
    settings: Settings, messages: list[tuple[str, Telemetry]], site: str, processes: int, workdir: Path
) -> dict[str, Any]:
    """Backlog drained by ``iotwatch gateway --processes N`` into Kafka."""
    topic = f"bench.{site}.raw"
    ensure_topics(settings.kafka, [topic, f"{topic}.dlq"])
    process, _ports = _gateway_process(settings, site, topic, processes, workdir, site)
    process.stop(timeout_s=120)  # the sessions exist now, offline: the backlog queues for them
    _publish(settings.mqtt, messages, f"{site}-pub")
    process, ports = _gateway_process(settings, site, topic, processes, workdir, site)
    try:
        _wait_confirmed(ports, len(messages))
        records = read_to_end(settings.kafka, topic, 600)  # the gateways confirmed them all
    finally:
        summary = process.stop(timeout_s=120)
    created = [record.timestamp()[1] for record in records]
    first, last = (min(created) / 1000, max(created) / 1000) if created else (0.0, 0.0)
    return {
        "processes": processes,
        "messages": len(records),
        "seconds": round(last - first, 3),
        "msgs_per_s": _rate(len(records), first, last),
        "forwarded": summary.get("forwarded"),
        "dead_lettered": summary.get("dead_lettered"),
    }


# -- paced latency ----------------------------------------------------------------------------

#: The first second of the paced phase warms both paths up (connections, the idempotent
#: producer's id, batches) and is not counted.
_WARMUP_S = 1.0


def _offered_rate(latencies: list[tuple[int, float]]) -> float:
    """Messages per second as published: from the stamps of those that arrived (the
    publishers' start-up and shutdown are not publishing time)."""
    stamps = [ts for ts, _ in latencies]
    return _rate(len(stamps), min(stamps) / 1000, max(stamps) / 1000) if stamps else 0.0


def _counted(latencies: list[tuple[int, float]], started: float) -> list[float]:
    """Latencies of the messages published after the warm-up (``(payload ts, latency)``)."""
    cut = (started + _WARMUP_S) * 1000
    return [latency for ts, latency in latencies if ts >= cut]


def _figures(latencies: list[tuple[int, float]], started: float) -> dict[str, Any]:
    """A paced path's figures from its ``(payload ts, latency ms)``: the messages counted (after
    the warm-up) and received, the rate they were published at, and their latency p50 and p99."""
    counted = _counted(latencies, started)
    return {
        "messages": len(counted),
        "received": len(latencies),
        "input_msgs_per_s": _offered_rate(latencies),
        "latency_ms": quantiles(counted, (0.5, 0.99), digits=3),
    }


def latency_raw(mqtt: MqttSettings, messages: list[tuple[str, Telemetry]], site: str, rate: float) -> dict[str, Any]:
    """Publish-to-subscriber latency through a bare subscriber."""
    latencies: list[tuple[int, float]] = []
    done = threading.Event()
    decode = msgspec.json.Decoder(Telemetry).decode

    def on_message(_c: Any, _u: Any, message: Any) -> None:
        ts = decode(message.payload).ts
        latencies.append((ts, time.time() * 1000 - ts))
        if len(latencies) >= len(messages):
            done.set()

    client = _session(mqtt, f"{site}-bare", f"iot/{site}/+/+/telemetry", 2000, on_message)
    started = _publish(mqtt, messages, f"{site}-pub", rate)
    done.wait(120)
    client.disconnect()
    client.loop_stop()
    return _figures(latencies, started)


def _read_latencies(
    settings: Settings,
    topic: str,
    expected: int,
    out: Queue[tuple[array[int], array[float], array[float]]],
    ready: Any,
    stop: Any,
) -> None:
    """Read ``topic`` as records become readable, as a process of its own (a thread of the
    bench would share its interpreter, and its garbage collections, with the messages the
    bench holds). Puts ``(payload ts, publish to readable ms, publish to the record's create
    time ms)`` per record on ``out``, kept meanwhile in arrays: no object per record for the
    collector to walk."""
    stamps, readable, created = array("q"), array("d"), array("d")
    consumer = _reader(settings, topic, 0)
    decode = msgspec.json.Decoder(Telemetry).decode
    ready.set()
    while not stop.is_set() and len(readable) < expected:
        # poll(), one record as soon as it is readable: consume(n, timeout) waits for n
        # records or the timeout, which would add up to the timeout to every latency
        record = consumer.poll(0.05)
        if record is not None and record.error() is None:
            now, ts = time.time() * 1000, decode(record.value() or b"").ts
            stamps.append(ts)
            readable.append(now - ts)
            created.append(record.timestamp()[1] - ts)
    consumer.close()
    out.put((stamps, readable, created))


@contextlib.contextmanager
def _spawned(target: Any, *args: Any, what: str) -> Iterator[Any]:
    """``target(*args, ready, stop)`` in a spawned process of its own, once it has set ``ready``;
    yields ``stop``, which is set (and the process joined) on the way out."""
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    process = context.Process(target=target, args=(*args, ready, stop))
    process.start()
    try:
        if not ready.wait(60):
            raise TimeoutError(f"{what} did not start")
        yield stop
    finally:
        stop.set()
        process.join(30)


def _paced_into_kafka(
    settings: Settings, messages: list[tuple[str, Telemetry]], topic: str, rate: float
) -> tuple[float, list[tuple[int, float]], list[tuple[int, float]]]:
    """Publish ``messages`` paced while a reader process reads ``topic``: (start, readable,
    created), each ``(payload ts, latency ms)``."""
    out: Queue[tuple[array[int], array[float], array[float]]] = multiprocessing.get_context("spawn").Queue()
    with _spawned(_read_latencies, settings, topic, len(messages), out, what="the Kafka reader") as stop:
        started = _publish(settings.mqtt, messages, f"{topic}-pub", rate)
        try:
            stamps, readable, created = out.get(timeout=120)
        except queue.Empty:
            stop.set()
            stamps, readable, created = out.get(timeout=30)
    return started, list(zip(stamps, readable, strict=True)), list(zip(stamps, created, strict=True))


def _bare_bridge(settings: Settings, client_id: str, mqtt_filter: str, topic: str, ready: Any, stop: Any) -> None:
    """The least a bridge does, as a process: a stock paho subscriber (automatic PUBACK, no
    validation) producing each payload with a plain producer (the gateway's linger, keyed by
    the topic's device id). Its latency is the two brokers' own, the gateway's reference."""
    producer = _plain_producer(settings)
    produce = producer.produce

    def on_message(_c: Any, _u: Any, message: Any) -> None:
        produce(topic, message.payload, message.topic.rsplit("/", 2)[1].encode())

    client = _session(settings.mqtt, client_id, mqtt_filter, settings.gateway.max_inflight, on_message)
    ready.set()
    while not stop.wait(0.1):
        producer.poll(0)
    client.disconnect()
    client.loop_stop()
    producer.flush(10)


def latency_bare_bridge(
    settings: Settings, messages: list[tuple[str, Telemetry]], site: str, rate: float
) -> dict[str, Any]:
    """Publish to a Kafka reader through the bare bridge: the same two brokers and reader as
    the gateway path, none of the gateway's own work."""
    topic = f"bench.{site}.raw"
    ensure_topics(settings.kafka, [topic])
    bridge = (settings, f"{site}-bridge", f"iot/{site}/+/+/telemetry", topic)
    with _spawned(_bare_bridge, *bridge, what="the bare bridge"):
        started, readable, _created = _paced_into_kafka(settings, messages, topic, rate)
    return _figures(readable, started)


def latency_gateway(
    settings: Settings, messages: list[tuple[str, Telemetry]], site: str, rate: float, workdir: Path
) -> dict[str, Any]:
    """Publish-to-Kafka latency through one gateway process: to the record's create time
    (the gateway's produce call) and to when a consumer can read it (Kafka confirmed it)."""
    topic = f"bench.{site}.raw"
    ensure_topics(settings.kafka, [topic, f"{topic}.dlq"])
    process, _ports = _gateway_process(settings, site, topic, 1, workdir, site)
    try:
        started, readable, created = _paced_into_kafka(settings, messages, topic, rate)
    finally:
        summary = process.stop(timeout_s=120)
    return {
        **_figures(readable, started),
        "publish_to_create_time_ms": quantiles(_counted(created, started), (0.5, 0.99), digits=3),
        "gateway_delivery_ms": {q: summary.get(f"delivery_latency_ms_{q}") for q in ("p50", "p99")},
    }


@contextlib.contextmanager
def _brokers(base: Settings, workdir: Path, configured_kafka: bool) -> Iterator[tuple[Settings, dict[str, str]]]:
    """The settings to measure with, and which brokers they name: an embedded stack (no
    InfluxDB) started here and stopped afterwards, with the configured Kafka cluster instead
    of its own broker when ``configured_kafka`` (the embedded one then idles)."""
    stack_settings = base.model_copy(update={"stack": base.stack.model_copy(update={"influxdb": "none"})})
    stack = EmbeddedStack(stack_settings, workdir / "stack")
    state = stack.up()
    try:
        settings = state.apply_to(base)
        kafka_broker = state.services["kafka"].implementation
        if configured_kafka:
            settings = settings.model_copy(update={"kafka": base.kafka})
            kafka_broker = base.kafka.bootstrap_servers
        yield settings, {"mqtt_broker": state.services["mqtt"].implementation, "kafka_broker": kafka_broker}
    finally:
        stack.down()


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _added(path: dict[str, float | None], reference: dict[str, float | None]) -> dict[str, float | None]:
    """Latency quantiles of ``path`` over ``reference`` (ms)."""
    added: dict[str, float | None] = {}
    for q in ("p50", "p99"):
        a, b = path[q], reference[q]
        added[q] = round(a - b, 2) if a is not None and b is not None else None
    return added


@click.command("gateway")
@click.option("--messages", "total", default=100_000, help="Backlog size per drain run.")
@click.option("--devices", default=100, help="Devices the messages are spread over.")
@click.option(
    "--processes",
    default=2,
    type=click.IntRange(min=1),
    help="Processes of the multi-process runs (bare subscribers and gateway).",
)
@latency_options(
    rate=Preset(5000.0, "Input rate (msg/s) of the latency phase."),
    seconds=Preset(10.0, "Duration of the latency phase."),
)
@click.option(
    "--configured-kafka",
    is_flag=True,
    help="Measure on the Kafka cluster of the settings (--config, IOTWATCH_KAFKA_*; e.g. the compose "
    "file's Apache Kafka) instead of the embedded broker; creates bench.* topics there. MQTT stays "
    "the bench's own broker, where its publishers need no device accounts.",
)
@click.option(
    "--kafka-warmup-seconds",
    "warmup_s",
    type=click.FloatRange(min=0),
    default=KAFKA_WARMUP_S,
    help="Paced produce and fetch at --rate before the runs, so that they meet a warm broker.",
)
@json_option
@pass_app
def bench_gateway(
    app: AppContext,
    total: int,
    devices: int,
    processes: int,
    rate: float,
    latency_seconds: float,
    configured_kafka: bool,
    warmup_s: float,
    as_json: bool,
) -> None:
    """The gateway's ceiling (backlog drain) and added latency, against bare MQTT subscribers.

    Starts its own embedded MQTT and Kafka brokers (no InfluxDB); --configured-kafka uses
    the configured Kafka cluster instead of the embedded one.
    Each drain run queues --messages QoS 1 messages for offline persistent sessions, then
    measures how fast bare subscribers and the gateway drain them, with 1 and --processes
    processes.
    """
    run = f"{int(time.time()) % 100000}"
    per_device = max(1, total // devices)
    paced_per_device = max(1, int(rate * (latency_seconds + _WARMUP_S)) // devices)
    with (
        tempfile.TemporaryDirectory(prefix="iotwatch-bench-") as tmp,
        _brokers(app.settings, Path(tmp), configured_kafka) as (settings, brokers),
    ):
        warmup = warm_kafka(settings, rate, warmup_s)
        receive_maximum = settings.gateway.max_inflight
        counts = sorted({1, processes})
        drains: dict[str, dict[str, Any]] = {}
        for n in counts:
            site = f"b{run}r{n}"
            raw = drain_bare(settings.mqtt, _payloads(devices, per_device, site), site, n, receive_maximum)
            site = f"b{run}f{n}"
            fast = drain_bare(
                settings.mqtt, _payloads(devices, per_device, site), site, n, receive_maximum, buffered_reads=True
            )
            site = f"b{run}g{n}"
            through = drain_gateway(settings, _payloads(devices, per_device, site), site, n, Path(tmp))
            drains[str(n)] = {
                "bare_subscriber_msgs_per_s": raw["msgs_per_s"],
                "gateway_msgs_per_s": through["msgs_per_s"],
                "ratio": _ratio(through["msgs_per_s"], raw["msgs_per_s"]),
                # against a subscriber reading the socket as the gateway does:
                # what the gateway's own work costs
                "bare_buffered_msgs_per_s": fast["msgs_per_s"],
                "ratio_to_buffered": _ratio(through["msgs_per_s"], fast["msgs_per_s"]),
                "bare": raw,
                "bare_buffered": fast,
                "gateway": through,
            }
        site = f"b{run}lr"
        raw_paced = latency_raw(settings.mqtt, _payloads(devices, paced_per_device, site), site, rate)
        site = f"b{run}lb"
        bridge_paced = latency_bare_bridge(settings, _payloads(devices, paced_per_device, site), site, rate)
        site = f"b{run}lg"
        gateway_paced = latency_gateway(settings, _payloads(devices, paced_per_device, site), site, rate, Path(tmp))
    one, many = drains["1"], drains[str(processes)]
    result = {
        "benchmark": "gateway",
        "messages": devices * per_device,
        "devices": devices,
        "processes": processes,
        **brokers,
        "kafka_warmup": {"seconds": warmup_s, "msgs_per_s": rate, **warmup},
        "backlog_drain": {
            **{f"processes_{n}": drains[str(n)] for n in (str(c) for c in counts)},
            "gateway_scaling": _ratio(many["gateway_msgs_per_s"], one["gateway_msgs_per_s"]),
        },
        "latency": {
            "input_rate_msgs_per_s": rate,
            "messages": raw_paced["messages"],
            "raw": raw_paced,
            "gateway": gateway_paced,
            "raw_publish_to_subscriber_ms": raw_paced["latency_ms"],
            "gateway_publish_to_kafka_readable_ms": gateway_paced["latency_ms"],
            # Below the asked rate, the publishers (not the paths) were the limit: the
            # latencies then include their own queueing and say little about either path.
            "input_rate_reached": min(
                raw_paced["input_msgs_per_s"], bridge_paced["input_msgs_per_s"], gateway_paced["input_msgs_per_s"]
            )
            >= 0.95 * rate,
            "added_ms": _added(gateway_paced["latency_ms"], raw_paced["latency_ms"]),
            # the same two brokers and reader without the gateway's own work: what of the
            # added latency is the Kafka hop itself
            "bare_bridge": bridge_paced,
            "bare_bridge_publish_to_kafka_readable_ms": bridge_paced["latency_ms"],
            "added_over_bare_bridge_ms": _added(gateway_paced["latency_ms"], bridge_paced["latency_ms"]),
        },
        "cpu_count": os.cpu_count(),
    }
    emit(result, as_json, echo("gateway"))
