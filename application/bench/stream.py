"""``iotwatch bench stream``: the streaming job against a plain consumer, same run: throughput
and state per device at several fleet sizes, spike-to-alert latency at stated input rates, and
start-up on a backlog (docs/benchmarks.md says how)."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition

from iotwatch.application.bench.render import echo
from iotwatch.application.stack import EmbeddedStack
from iotwatch.cli import AppContext, NumberList, Preset, emit, json_option, latency_options, pass_app
from iotwatch.clients.kafka import ensure_topics, produce_waiting
from iotwatch.contract.alerts import decode_alert
from iotwatch.contract.dead_letters import H_GATEWAY, H_INGEST_MS, H_MQTT_QOS, H_MQTT_TOPIC
from iotwatch.contract.device_topics import telemetry_topic
from iotwatch.models.catalog import kernel_for, make
from iotwatch.models.kernels import Kernel, warm_kernel
from iotwatch.settings import Settings, StreamSettings
from iotwatch.stats import quantile, quantiles

if TYPE_CHECKING:
    from iotwatch.streaming.job import RunningJob

#: Seconds of input at a latency run's rate before its measured seconds: the figure is the
#: latency of a job that keeps up, past its start-up's backlog (docs/benchmarks.md, ``settling``).
SETTLE_S = 15.0
SPIKE_EVERY = 97  # readings per device between injected spikes (after the warm-up)

#: A reading's temperature and humidity: mean and spread, and a spike's rise in temperature.
TEMPERATURE_C, TEMPERATURE_SD, SPIKE_C = 21.0, 0.2, 8.0
HUMIDITY_PCT, HUMIDITY_SD = 45.0, 0.5


class LiveReadings:
    """The bench's readings of ``devices`` thermostats (four metrics, two of them scored), as
    the contract's JSON from a template per device, one round of all devices at a time.

    The generator shares the two cores with the job it measures: a :class:`Telemetry` built
    and encoded per reading cost about 15 µs, so at 20,000 readings/s the generator's
    process took about half a core, more than the job's Python workers. Here a reading is
    one bytes format over numbers drawn per round with numpy."""

    def __init__(self, devices: int, seed: int = 2) -> None:
        self.devices = devices
        self.ids = [f"bench-th-{device}" for device in range(devices)]
        self.keys = [device_id.encode() for device_id in self.ids]
        self.templates = [
            b'{"v":1,"device_id":"%s","device_type":"thermostat","site":"bench-%d","seq":%%d,"ts":%%d,'
            b'"metrics":{"temperature_c":%%.6f,"humidity_pct":%%.6f,"setpoint_c":21.0,"hvac_on":0.0}}'
            % (key, device % 10)
            for device, key in enumerate(self.keys)
        ]
        self.mqtt_topics = [
            telemetry_topic(f"bench-{device % 10}", "thermostat", device_id).encode()
            for device, device_id in enumerate(self.ids)
        ]
        self.rng = np.random.default_rng(seed)

    def round(self, spikes: np.ndarray) -> tuple[list[float], list[float]]:
        """Temperatures and humidities of one reading per device; ``spikes``: which devices spike."""
        temperature = TEMPERATURE_C + self.rng.normal(0, TEMPERATURE_SD, self.devices) + SPIKE_C * spikes
        humidity = HUMIDITY_PCT + self.rng.normal(0, HUMIDITY_SD, self.devices)
        return temperature.tolist(), humidity.tolist()

    def payload(self, device: int, seq: int, ts: int, temperature: float, humidity: float) -> bytes:
        return self.templates[device] % (seq, ts, temperature, humidity)


def preload(settings: Settings, topic: str, devices: int, per_device: int) -> int:
    """Write ``per_device`` readings of each device to ``topic`` as the gateway writes them:
    with an idempotent producer, so the broker has handed out producer ids before the job's
    own producers ask for one (on a fresh broker the first request waits for the
    controller's allocation, about 0.4 s, which a running deployment has long paid)."""
    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True, "linger.ms": 20})
    readings, calm = LiveReadings(devices, seed=1), np.zeros(devices, dtype=bool)
    t0 = int(time.time() * 1000) - per_device * 1000
    for seq in range(per_device):
        temperatures, humidities = readings.round(calm)
        for device in range(devices):
            value = readings.payload(device, seq, t0 + seq * 1000, temperatures[device], humidities[device])
            produce_waiting(producer, topic, readings.keys[device], value)
        producer.poll(0)
    producer.flush(60)
    return devices * per_device


def measure_consumer(settings: Settings, topic: str, total: int) -> dict[str, Any]:
    """The raw path: read and JSON-parse every record with a plain confluent-kafka consumer."""
    consumer = Consumer(
        {**settings.kafka.client_config(), "group.id": f"bench-raw-{time.time_ns()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(settings.kafka.partitions)])
    started, count = time.monotonic(), 0
    deadline = started + 600
    while count < total and time.monotonic() < deadline:
        for message in consumer.consume(10_000, 0.5):
            if message.error() is None:
                json.loads(message.value() or b"")
                count += 1
    elapsed = time.monotonic() - started
    consumer.close()
    return {"records": count, "seconds": round(elapsed, 3), "records_per_s": round(count / elapsed, 1)}


def _start_job(spark: Any, settings: Settings, workdir: Path, name: str, available_now: bool = False) -> RunningJob:
    """The streaming job as query ``bench_<name>``, its checkpoint and archive in ``workdir``."""
    from iotwatch.streaming.job import start

    return start(
        spark,
        settings,
        checkpoint_dir=workdir / f"ck-{name}",
        archive_dir=workdir / f"archive-{name}",
        available_now=available_now,
        query_name=f"bench_{name}",
    )


def measure_job(spark: Any, settings: Settings, workdir: Path, name: str) -> dict[str, Any]:
    """The whole job over the backlog (availableNow); steady state leaves out the first
    micro-batch, which also pays query planning and Python worker start-up."""
    started = time.monotonic()
    job = _start_job(spark, settings, workdir, name, available_now=True)
    job.await_backlog(1800)
    elapsed = time.monotonic() - started
    records = int(job.totals.get("reading_records", 0))
    later = [b for b in list(job.reporter.history)[1:] if b["input_rows"]]
    steady_rows, steady_ms = sum(b["input_rows"] for b in later), sum(b["trigger_ms"] for b in later)
    totals = job.totals
    state_devices = int(totals.get("state_device_writes") or 0)  # devices in the shards written, summed over batches
    return {
        "records": records,
        "seconds": round(elapsed, 3),
        "records_per_s": round(records / elapsed, 1),
        "steady_state_records_per_s": round(steady_rows / steady_ms * 1000, 1) if steady_ms else None,
        "batch_ms": [b["trigger_ms"] for b in job.reporter.history if b["input_rows"]],
        "batch_rows": [b["input_rows"] for b in job.reporter.history if b["input_rows"]],
        "state_bytes_per_device": round(totals["state_bytes_written"] / state_devices, 1) if state_devices else None,
        "totals": dict(job.totals),
    }


def own_topics(settings: Settings, prefix: str) -> Settings:
    """``settings`` with a run's own raw, alert and dead-letter topics (``<prefix>.raw``, ...), created."""
    topics = settings.topics.model_copy(update={name: f"{prefix}.{name}" for name in ("raw", "alerts", "dlq")})
    ensure_topics(settings.kafka, topics.kafka_topics())
    return settings.model_copy(update={"topics": topics})


def measure_throughput(
    spark: Any, settings: Settings, workdir: Path, run: str, devices: int, records: int
) -> dict[str, Any]:
    """One fleet size: the plain consumer, then the job twice over the same pre-loaded topic (docs/benchmarks.md)."""
    settings = own_topics(settings, f"bench.{run}.{devices}")
    total = preload(settings, settings.topics.raw, devices, max(1, records // devices))
    raw = measure_consumer(settings, settings.topics.raw, total)
    warm_up = measure_job(spark, settings, workdir, f"warm_up{devices}")
    job = measure_job(spark, settings, workdir, f"d{devices}")
    steady = job["steady_state_records_per_s"] or job["records_per_s"]
    return {
        "devices": devices,
        "records": total,
        "plain_consumer_records_per_s": raw["records_per_s"],
        "job_records_per_s": job["records_per_s"],
        "job_steady_state_records_per_s": steady,
        "ratio": round(steady / raw["records_per_s"], 4) if raw["records_per_s"] else None,
        "state_bytes_per_device": job["state_bytes_per_device"],
        "plain_consumer": raw,
        "job": job,
        "warm_up": {k: warm_up[k] for k in ("steady_state_records_per_s", "batch_ms")},
    }


def _spike_alerts(
    settings: Settings, wanted: dict[str, set[int]], *, timeout_s: float, idle_s: float | None = None
) -> list[tuple[int, int]]:
    """``(first event ms, append ms)`` of the raised alerts whose first event is one of
    ``wanted``'s (device id -> event times), read from the alert topic's start as they come:
    until one is there for each wanted event or, with ``idle_s``, until the topic has been
    quiet that long (every alert of a stopped job read, repeats too); at most ``timeout_s``."""
    consumer = Consumer(
        {**settings.kafka.client_config(), "group.id": f"bench-alerts-{time.time_ns()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(settings.topics.alerts, p, 0) for p in range(settings.kafka.partitions)])
    found: list[tuple[int, int]] = []
    expected, deadline = sum(len(v) for v in wanted.values()), time.monotonic() + timeout_s
    idle_since = time.monotonic()
    while time.monotonic() < deadline:
        if idle_s is None and len(found) >= expected:
            break
        if idle_s is not None and time.monotonic() - idle_since >= idle_s:
            break
        for message in consumer.consume(1000, 0.2 if idle_s is None else 0.5):
            idle_since = time.monotonic()
            if message.error():
                continue
            alert = decode_alert(message.value())
            if alert.raised and alert.first_event_ms in wanted.get(alert.device_id, ()):
                found.append((alert.first_event_ms, message.timestamp()[1]))
    consumer.close()
    return found


def detector_costs(stream: StreamSettings, readings: int = 20_000) -> list[dict[str, Any]]:
    """Each detector of the job: the device types it scores, its state row per metric, and
    nanoseconds per metric-reading through its compiled kernel (one batch call) against the
    same step called once a reading through its class (:func:`kernel_cost`)."""

    out = []
    for name in stream.detector_names():
        types = sorted(t for t, d in stream.device_detectors.items() if d == name)
        cost = kernel_cost(name, streams=200, readings=readings)
        out.append(
            {
                "detector": name,
                "device_types": "every type not named" if name == stream.device_detector else types,
                "state_bytes_per_metric": _metric_kernel(name).STATE_SIZE * 8,
                "batch_ns_per_reading": cost["batch_ns"],
                "class_ns_per_reading": cost["class_ns"],
            }
        )
    return out


def _metric_kernel(name: str) -> Kernel[Any]:
    """The kernel whose rows the job keeps for a metric of ``name`` with no declared range
    (``declared_levels``: episode_likelihood's, see ``streaming/detector_plan.py``)."""
    kernel = kernel_for(name)
    narrow: Kernel[Any] = getattr(kernel, "UNDECLARED", kernel)
    return narrow


def kernel_cost(name: str, streams: int = 1000, readings: int = 200_000, seed: int = 0) -> dict[str, float]:
    """Nanoseconds a reading on interleaved noisy streams (no declared range), after
    warm-up: through the detector class, one ``score_learn_one`` call (a batch of one
    reading) a reading, and through one batch call of the kernel the job runs on such
    metrics; the difference is what a call costs in Python."""
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, streams, readings).astype(np.int64)
    values = np.round(rng.normal(20.0, 1.0, readings) + stream % 7, 2)
    t_ms = 1_700_000_000_000 + np.arange(readings, dtype=np.int64) * 100
    kernel = _metric_kernel(name)
    warm_kernel(kernel, make(name))
    params = kernel.params_vector(make(name))
    states = np.tile(kernel.initial_state(params), (streams, 1))
    start = time.perf_counter()
    kernel.score_learn(states, stream, values, t_ms, params)
    compiled = time.perf_counter() - start
    detectors = [make(name) for _ in range(streams)]
    start = time.perf_counter()
    for s, v, t in zip(stream.tolist(), values.tolist(), t_ms.tolist(), strict=True):
        detectors[s].score_learn_one({"m": v}, t)
    one_by_one = time.perf_counter() - start
    return {"class_ns": round(one_by_one / readings * 1e9, 1), "batch_ns": round(compiled / readings * 1e9, 1)}


def measure_startup(spark: Any, settings: Settings, workdir: Path, run: str, devices: int = 100) -> dict[str, Any]:
    """The session's first query, as a job starting on a backlog: each device's warm-up
    readings and then a spike are in Kafka; the seconds from the query's start to the spikes'
    alerts, and the first micro-batch's duration (planning, Python workers, state set-up)."""
    settings = own_topics(settings, f"bench.{run}.startup")
    topics = settings.topics
    warm = make(settings.stream.device_detector, **settings.stream.device_detector_params).warmup_readings() + 5
    preload(settings, topics.raw, devices, warm)
    producer = Producer(settings.kafka.client_config())
    spikes: dict[str, set[int]] = {}
    readings, now = LiveReadings(devices, seed=3), int(time.time() * 1000)
    temperatures, humidities = readings.round(np.ones(devices, dtype=bool))
    for device in range(devices):
        spikes.setdefault(readings.ids[device], set()).add(now)
        value = readings.payload(device, warm, now, temperatures[device], humidities[device])
        producer.produce(topics.raw, key=readings.keys[device], value=value)
    producer.flush(30)
    started_ms = time.time() * 1000
    job = _start_job(spark, settings, workdir, f"startup_{run}")
    try:
        appended = sorted(ms for _, ms in _spike_alerts(settings, spikes, timeout_s=300))
        deadline = time.monotonic() + 60  # the progress report follows the batch's commit
        while not (batches := [b["trigger_ms"] for b in job.reporter.history if b["input_rows"]]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.2)
        phases = next((p for p in job.reporter.phases if p["records"]), None)
    finally:
        job.stop()
    after = [(ms - started_ms) / 1000 for ms in appended]
    return {
        "devices": devices,
        "records": devices * (warm + 1),
        "spikes_alerted": len(appended),
        "start_to_alert_s": {
            "first": round(after[0], 2) if after else None,
            "last": round(after[-1], 2) if after else None,
        },
        "first_batch_ms": batches[0] if batches else None,
        "first_batch_phases_ms": phases,
    }


def _latency_summary(latencies: list[int]) -> dict[str, float | None]:
    """p50, p99 and max of sorted latencies (ms)."""
    return {**quantiles(latencies, (0.5, 0.99), digits=1), "max": latencies[-1] if latencies else None}


def measure_latency(
    spark: Any, settings: Settings, workdir: Path, rate: float, seconds: float, devices: int, settle_s: float
) -> dict[str, Any]:
    """Alerts for injected spikes at a steady input rate: spike event time -> alert append time,
    over ``seconds`` that follow ``settle_s`` of the same input (reported apart, as ``settling``)."""
    stream = settings.stream
    stop = threading.Event()
    spikes: dict[str, set[int]] = {}
    produced = [0]

    def produce() -> None:
        # as the gateway forwards readings: its linger, and its four headers on every record
        producer = Producer({**settings.kafka.client_config(), "linger.ms": settings.gateway.linger_ms})
        gateway = f"bench-{os.getpid()}".encode()
        readings = LiveReadings(devices)
        device_numbers = np.arange(devices)
        seq, started = 1, time.monotonic()
        warmup = make(stream.device_detector, **stream.device_detector_params).warmup_readings() + 5
        while not stop.is_set():
            spiking = (seq + device_numbers) % SPIKE_EVERY == 0 if seq > warmup else np.zeros(devices, dtype=bool)
            temperatures, humidities = readings.round(spiking)
            for device in range(devices):
                ts = int(time.time() * 1000)
                if spiking[device]:
                    spikes.setdefault(readings.ids[device], set()).add(ts)
                headers: list[tuple[str, str | bytes | None]] = [
                    (H_MQTT_TOPIC, readings.mqtt_topics[device]),
                    (H_MQTT_QOS, b"1"),
                    (H_INGEST_MS, b"%d" % ts),
                    (H_GATEWAY, gateway),
                ]
                value = readings.payload(device, seq, ts, temperatures[device], humidities[device])
                produce_waiting(producer, settings.topics.raw, readings.keys[device], value, headers=headers)
                produced[0] += 1
            producer.poll(0)
            seq += 1
            delay = started + (seq - 1) * devices / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        producer.flush(30)

    preload(settings, settings.topics.raw, devices, 1)  # seq 0 of every device: the job warms up on it
    job = _start_job(spark, settings, workdir, f"latency_{rate:g}")
    deadline = time.monotonic() + 300
    while job.totals.get("reading_records", 0) < devices and time.monotonic() < deadline:
        time.sleep(0.2)
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    started = time.monotonic()
    time.sleep(settle_s)
    measured_from_ms, settled_batches = int(time.time() * 1000), len(job.reporter.history)
    time.sleep(seconds)
    stop.set()
    producer.join()
    achieved = produced[0] / (time.monotonic() - started)
    time.sleep(3 + 2 * stream.trigger_interval_s)
    batches = [b["trigger_ms"] for b in list(job.reporter.history)[settled_batches:] if b["input_rows"]]
    phases = [p for p in list(job.reporter.phases)[settled_batches:] if p["records"]]
    job.stop()
    alerts = _spike_alerts(settings, spikes, timeout_s=600, idle_s=3)
    latencies = sorted(ms - first for first, ms in alerts if first >= measured_from_ms)
    settling = sorted(ms - first for first, ms in alerts if first < measured_from_ms)
    injected = sum(1 for times in spikes.values() for ts in times if ts >= measured_from_ms)
    return {
        "input_rate_records_per_s": rate,
        "achieved_rate_records_per_s": round(achieved, 1),
        "seconds": seconds,
        "devices": devices,
        "spikes_injected": injected,
        "spikes_alerted": len(latencies),
        "latency_ms": _latency_summary(latencies),
        "settling": {
            "seconds": settle_s,
            "spikes_injected": sum(len(v) for v in spikes.values()) - injected,
            "spikes_alerted": len(settling),
            "latency_ms": _latency_summary(settling),
        },
        "batch_ms_p50": quantile(batches, 0.5),
        "batch_ms_p99": quantile(batches, 0.99),
        # where a micro-batch's time goes, per phase of Spark's progress report
        "batch_phases_ms": {
            name: quantiles([p.get(name, 0) for p in phases], (0.5, 0.99), digits=0)
            for name in sorted({k for p in phases for k in p} - {"records"})
        },
        "batch_records": quantiles([p["records"] for p in phases], (0.5, 0.99), digits=0),
        "trigger_interval_s": stream.trigger_interval_s,
    }


@click.command("stream")
@click.option(
    "--records",
    default=600_000,
    help="Pre-loaded records per throughput run (three micro-batches of the default size).",
)
@click.option(
    "--devices",
    "fleet_sizes",
    type=NumberList(),
    default="1000,10000,100000",
    help="Fleet sizes of the throughput runs (comma-separated; 4 metrics per reading).",
)
@latency_options(
    rate=Preset("5000,20000", "Input rates (records/s) of the latency runs (comma-separated)."),
    seconds=Preset(30.0, "Duration of each latency run."),
    rates=True,
)
@click.option(
    "--settle-seconds",
    "settle_s",
    type=float,
    default=SETTLE_S,
    help="Input at the rate before each latency run's measured seconds (reported apart, as settling).",
)
@click.option(
    "--latency-devices",
    default=500,
    help="Devices of the latency runs at 5,000 records/s (scaled with the rate).",
)
@json_option
@pass_app
def bench_stream(
    app: AppContext,
    records: int,
    fleet_sizes: list[int],
    rates: list[int],
    latency_seconds: float,
    settle_s: float,
    latency_devices: int,
    as_json: bool,
) -> None:
    """Records/s through the streaming job against a plain consumer, state per device, and
    spike-to-alert latency at stated rates.

    Starts its own embedded Apache Kafka broker and InfluxDB (when installed), and one
    local Spark session for every run (its start-up is not counted).
    """
    from iotwatch.streaming.job import session_scope

    run = str(int(time.time()))
    base = app.settings
    with tempfile.TemporaryDirectory(prefix="iotwatch-bench-stream-") as tmp:
        stack = EmbeddedStack(base, Path(tmp) / "stack")
        state = stack.up()
        try:
            settings = state.apply_to(base)
            stream = settings.stream
            with session_scope(stream, "iotwatch-bench-stream") as spark:
                spark.range(1).count()  # the JVM is up before anything is timed
                startup = measure_startup(spark, settings, Path(tmp), run)
                throughput = [
                    measure_throughput(spark, settings, Path(tmp), run, devices, max(records, 3 * devices))
                    for devices in fleet_sizes
                ]
                latency = []
                for rate in rates:
                    live = own_topics(settings, f"bench.{run}.live{rate}")
                    devices = max(1, int(latency_devices * rate / 5000))
                    latency.append(measure_latency(spark, live, Path(tmp), rate, latency_seconds, devices, settle_s))
        finally:
            stack.down()
    first = throughput[0] if throughput else None
    result = {
        "benchmark": "stream",
        "throughput": first,
        "fleet_sizes": throughput,
        "throughput_at_largest_vs_smallest_fleet": (
            round(throughput[-1]["job_steady_state_records_per_s"] / first["job_steady_state_records_per_s"], 4)
            if first and len(throughput) > 1
            else None
        ),
        "latency": latency,
        "startup": startup,
        "detectors": detector_costs(base.stream),
        "spark_master": base.stream.spark_master,
        "shuffle_partitions": base.stream.shuffle_partitions,
        "max_offsets_per_trigger": base.stream.max_offsets_per_trigger,
        "cpu_count": os.cpu_count(),
    }
    emit(result, as_json, echo("stream"))
