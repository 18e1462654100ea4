"""The streaming job end to end: Spark local, the real Apache Kafka broker and InfluxDB."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from iotwatch.clients.influx import InfluxV1Client
from iotwatch.clients.kafka import ensure_topics
from iotwatch.contract.dead_letters import H_KAFKA_TOPIC, H_REASON, header_value
from iotwatch.errors import IotwatchError
from iotwatch.settings import Settings
from iotwatch.streaming.job import PLANNING, start
from iotwatch.streaming.worker_daemon import GLIBC_MALLOC
from tests.helpers import read_topic, spark_jvms, user_env, wait_for
from tests.support.scenario import write_scenario

pytestmark = pytest.mark.slow


def _job_settings(settings: Settings, **stream: object) -> Settings:
    update = {"silence_timeout_s": 3600.0, "max_offsets_per_trigger": 400, **stream}
    return settings.model_copy(update={"stream": settings.stream.model_copy(update=update)})


def _python_daemons(jvm_pid: int) -> list[psutil.Process]:
    """The JVM's Python worker daemons (one per pool of workers)."""
    daemons = []
    for child in psutil.Process(jvm_pid).children():
        try:
            if {"pyspark.daemon", "iotwatch.streaming.worker_daemon"} & set(child.cmdline()):
                daemons.append(child)
        except psutil.Error:  # a worker that ended meanwhile
            pass
    return daemons


def _mapped_blocks_after_24_mb(_: object) -> str:
    """In a Python worker: a 24 MB numpy array's way through malloc (mallinfo2's mapped blocks)."""
    import ctypes

    import numpy as np

    class MallInfo(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
        ]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo
    before = libc.mallinfo2().hblks
    array = np.ones(3 << 20)
    return json.dumps([os.environ.get("GLIBC_TUNABLES"), libc.mallinfo2().hblks - before, float(array[0])])


def test_python_workers_serve_batch_sized_blocks_from_the_heap(spark) -> None:
    """The job's Python workers run with its malloc settings (streaming/worker_daemon.py): a
    block of 24 MB comes from malloc's heap, whose freed pages stay mapped, not from
    a mapping of its own that each batch would fault in anew."""
    from pyspark.sql import functions as F

    blocks = F.udf(_mapped_blocks_after_24_mb)
    tunables, mapped, _ = json.loads(spark.range(1).select(blocks("id")).first()[0])
    assert tunables == GLIBC_MALLOC
    assert mapped == 0


def _alerts(settings: Settings) -> list[dict]:
    return [json.loads(m.value()) for m in read_topic(settings.kafka, settings.topics.alerts, timeout_s=30, idle_s=3)]


def test_job_scores_alerts_archives_and_accounts_for_every_record(
    spark, test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    settings = _job_settings(test_settings)
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    scenario = write_scenario(settings, unique)
    job = start(spark, settings, checkpoint_dir=tmp_path / "ck", archive_dir=tmp_path / "archive", available_now=True)
    job.await_backlog(600)
    assert job.query.exception() is None
    totals = job.totals

    # Alerts: each injected anomaly raised on the alert topic, read with a plain consumer.
    alerts = _alerts(settings)
    raised = {(a["device_id"], a["rule"]) for a in alerts if a["state"] == "raised"}
    for device, rule in scenario.expected_alerts.items():
        assert (device, rule) in raised, f"no {rule} alert for {device}: {sorted(raised)}"
    assert not {d for d, _ in raised} & set(scenario.quiet_devices)
    sample = next(a for a in alerts if a["rule"] == "crash")
    for field in (
        "alert_id",
        "state",
        "severity",
        "rule",
        "detector",
        "device_id",
        "device_type",
        "site",
        "metric",
        "value",
        "score",
        "threshold",
        "contributors",
        "first_event_time",
        "last_event_time",
        "occurrences",
        "detected_at",
        "model_version",
        "message",
    ):
        assert field in sample
    assert sample["severity"] == "critical" and "crash" in sample["message"]

    # Accounting: every record is a scored reading, a duplicate, late, or dead-lettered.
    published = sum(len(s) for s in scenario.readings.values())
    assert totals["reading_records"] == published
    assert totals["duplicate"] == scenario.duplicates
    assert totals["late"] == len(scenario.late)
    assert totals["dlq"] == scenario.malformed
    # State: after the first micro-batches, shards come from the executor's copy (streaming/shard_cache.py).
    assert 0 < totals["state_shards_cached"] < totals["state_shards_read"]
    # Where the operator's time went: each worker step timed in every call.
    assert totals["worker_ms_engine"] > 0 and all(f"worker_ms_{s}" in totals for s in ("unpack", "sinks", "archive"))
    # One pool of Python workers: the packing step and the stateful operator run in the same
    # workers (one daemon), not each in workers of their own. The daemon has loaded the job
    # (pandas among it) before forking them, and forks from its one thread.
    daemons = _python_daemons(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    assert len(daemons) == 1
    assert "iotwatch.streaming.worker_daemon" in daemons[0].cmdline()
    assert daemons[0].num_threads() == 1
    assert any("/pandas/" in m.path for m in daemons[0].memory_maps())

    # Archive: clean readings in Parquet, partitioned by date and device type, each (device, seq) once.
    archive = pd.read_parquet(tmp_path / "archive" / "readings")
    archived = archive.drop_duplicates(["device_id", "seq"]).groupby("device_id")["seq"].apply(sorted).to_dict()
    assert archived == scenario.readings
    assert set(archive["device_type"].astype(str)) == {"thermostat", "leak_sensor", "vehicle_edr"}
    assert len(archive) == len(archive.drop_duplicates(["device_id", "seq"]))  # one row per reading
    thermostat = archive[archive["device_type"].astype(str) == "thermostat"].iloc[-1]
    assert "temperature_c" in dict(thermostat["metrics"]) and "temperature_c" in dict(thermostat["scores"])

    # Dead letters: malformed records and the late one, each with a reason.
    dead = read_topic(settings.kafka, settings.topics.dlq, timeout_s=30, idle_s=3)
    reasons = sorted(header_value(m.headers(), H_REASON) or "" for m in dead)
    assert reasons == sorted(["invalid_json", "missing_field", "non_finite_number", "late"])

    # InfluxDB: per-device aggregates and pipeline health, read back with InfluxQL.
    client = InfluxV1Client(settings.influx)
    device = f"th-{unique}-0"
    series = client.query(
        f"SELECT count(mean) FROM device_metrics WHERE device_id = '{device}' AND "
        f"metric = 'temperature_c' AND time > now() - 2h"
    )
    assert series and series[0]["values"][0][1] >= 3  # minute buckets of a 4-minute stream
    health = client.query("SELECT sum(duplicate), sum(dlq) FROM pipeline WHERE stage = 'stream' AND time > now() - 10m")
    assert health and health[0]["values"][0][1] >= scenario.duplicates
    client.close()


def _stream_command(settings: Settings, checkpoint: Path, archive: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "iotwatch.application",
        "--log-level",
        "WARNING",
        "stream",
        "--kafka",
        settings.kafka.bootstrap_servers,
        "--influx",
        "",
        "--checkpoint",
        str(checkpoint),
        "--archive",
        str(archive),
        "--json",
        *extra,
    ]


def _env(settings: Settings) -> dict[str, str]:
    env = user_env()
    env.update(
        IOTWATCH_TOPIC_RAW=settings.topics.raw,
        IOTWATCH_TOPIC_DLQ=settings.topics.dlq,
        IOTWATCH_TOPIC_ALERTS=settings.topics.alerts,
        IOTWATCH_STREAM_SILENCE_TIMEOUT_S="3600",
    )
    return env


def test_kill_and_restart_from_checkpoint_accounts_for_everything_with_the_same_alert_ids(
    spark, stack_settings: Settings, unique: str, tmp_path: Path
) -> None:
    base = _job_settings(stack_settings)
    topics = base.topics.model_copy(
        update={"raw": f"t.{unique}.raw", "dlq": f"t.{unique}.dlq", "alerts": f"t.{unique}.alerts-a"}
    )
    reference = base.model_copy(update={"topics": topics})
    ensure_topics(reference.kafka, reference.topics.kafka_topics())
    scenario = write_scenario(reference, unique)

    # Uninterrupted reference run, in-process.
    job = start(
        spark,
        reference,
        checkpoint_dir=tmp_path / "ck-ref",
        archive_dir=tmp_path / "ar-ref",
        available_now=True,
        query_name="reference",
    )
    job.await_backlog(600)
    reference_ids = {a["alert_id"] for a in _alerts(reference)}
    assert len(reference_ids) >= len(scenario.expected_alerts)

    # The same input through a job stopped as a terminal's Ctrl-C stops it (SIGINT to its process
    # group: the JVM gets it too), restarted plainly, killed with SIGKILL mid-stream, and
    # restarted again from the same checkpoint.
    restarted = reference.model_copy(update={"topics": topics.model_copy(update={"alerts": f"t.{unique}.alerts-b"})})
    ensure_topics(restarted.kafka, [restarted.topics.alerts])
    checkpoint, archive = tmp_path / "ck-kill", tmp_path / "ar-kill"

    def commits() -> int:
        return len(list((checkpoint / "commits").glob("[0-9]*")))

    def stream_until_two_more_commits() -> tuple[subprocess.Popen[str], int, float]:
        """Start the job on the checkpoint; return it once it committed two more batches
        (or exited), with the commit count it started at and its deadline."""
        before = commits()
        running = subprocess.Popen(
            _stream_command(restarted, checkpoint, archive, "--trigger", "0.5", "--max-offsets-per-trigger", "50"),
            env=_env(restarted),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and commits() < before + 2 and running.poll() is None:
            time.sleep(0.2)
        return running, before, deadline

    for stop_signal in (signal.SIGINT, signal.SIGKILL):
        running, before, _ = stream_until_two_more_commits()
        jvms = spark_jvms(running.pid)
        if running.poll() is None:
            os.killpg(running.pid, stop_signal)
        _, err = running.communicate(timeout=120)
        # The JVM has a session of its own: a stopped command ends it and waits for it; a killed
        # one leaves it to end when its pipe closes, and until then it may still commit batches,
        # which the next start must not take for its own.
        grace = 5 if stop_signal == signal.SIGINT else 60
        _, lingering = psutil.wait_procs(jvms, timeout=grace)
        assert not lingering, f"Spark's JVM outlived the command stopped by {stop_signal.name} by {grace} s"
        assert commits() >= before + 2, f"no progress after restarting at batch {before}: {err[-3000:]}"
        if stop_signal == signal.SIGINT:
            assert running.returncode == 0, err[-3000:]
    # Its Python workers killed mid-stream (what a worker that crashes, or does not start in
    # time on a loaded machine, does to a micro-batch): the job starts the query again from its
    # checkpoint, in the same process, and goes on. A kill between micro-batches fails nothing
    # (Spark forks a new worker for the next task), so the workers are killed every few seconds
    # until one was running a task.
    running, before, deadline = stream_until_two_more_commits()
    assert commits() >= before + 2, f"no progress after restarting at batch {before}"
    assert running.stderr is not None
    log_lines: list[str] = []
    reader = threading.Thread(target=lambda: log_lines.extend(running.stderr or ()), daemon=True)
    reader.start()
    restarted_message = "starting it again from its checkpoint (restart 1 of"
    killed = 0
    while time.monotonic() < deadline and running.poll() is None:
        if any(restarted_message in line for line in log_lines):
            break
        for worker in forked_python_workers(running.pid):
            worker.kill()
            killed += 1
        time.sleep(3)
    assert killed, "no Python worker of the job found"
    killed_at = commits()
    while time.monotonic() < deadline and commits() < killed_at + 2 and running.poll() is None:
        time.sleep(0.2)
    alive = running.poll() is None
    if alive:
        os.killpg(running.pid, signal.SIGINT)
    running.wait(timeout=120)
    reader.join(timeout=10)
    err = "".join(log_lines)
    assert alive, err[-3000:]
    assert running.returncode == 0 and restarted_message in err, err[-3000:]
    assert commits() >= killed_at + 2, err[-3000:]
    second = subprocess.run(
        _stream_command(restarted, checkpoint, archive, "--available-now"),
        env=_env(restarted),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert {a["alert_id"] for a in _alerts(restarted)} == reference_ids

    archived = pd.read_parquet(archive / "readings").drop_duplicates(["device_id", "seq"])
    assert archived.groupby("device_id")["seq"].apply(sorted).to_dict() == scenario.readings


def forked_python_workers(job_pid: int) -> list[psutil.Process]:
    """The job's Python workers: the processes its JVM's worker daemons forked, not the daemons
    themselves (Spark answers a dead daemon by starting another, which fails no micro-batch)."""
    workers = []
    for jvm in spark_jvms(job_pid):
        try:
            for daemon in _python_daemons(jvm.pid):
                workers += [worker for worker in daemon.children() if worker.status() != psutil.STATUS_ZOMBIE]
        except psutil.Error:  # the JVM, a daemon or a worker ended meanwhile
            continue
    return workers


def test_replay_reprocesses_the_log_into_separate_outputs_and_compares(
    spark, test_settings: Settings, unique: str, tmp_path: Path, monkeypatch
) -> None:
    from click.testing import CliRunner

    from iotwatch.application.cli import cli

    settings = _job_settings(test_settings)
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    scenario = write_scenario(settings, unique)
    for name, value in {
        "IOTWATCH_TOPIC_RAW": settings.topics.raw,
        "IOTWATCH_TOPIC_ALERTS": settings.topics.alerts,
        "IOTWATCH_TOPIC_DLQ": settings.topics.dlq,
        "IOTWATCH_STREAM_SILENCE_TIMEOUT_S": "3600",
        "IOTWATCH_STREAM_CHECKPOINT_DIR": str(tmp_path / "ck" / "live"),
        "IOTWATCH_STREAM_ARCHIVE_DIR": str(tmp_path / "archive"),
    }.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(
        cli,
        [
            "replay",
            "--tag",
            "v2",
            "--kafka",
            settings.kafka.bootstrap_servers,
            "--influx",
            settings.influx.url or "",
            "--json",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output[-2000:]
    report = json.loads(result.output[result.output.index("{") :])
    assert report["alerts_topic"] == f"{settings.topics.alerts}.v2"
    assert report["totals"]["reading_records"] == sum(len(s) for s in scenario.readings.values())
    comparison = report["comparison"]
    assert comparison["live_alerts"] == 0 and comparison["replay_alerts"] >= len(scenario.expected_alerts)
    assert {"anomaly_score", "crash", "water_leak"} <= set(comparison["only_replay"])
    assert (tmp_path / "ck" / "replay-v2").is_dir() and (tmp_path / "archive-v2" / "readings").is_dir()
    client = InfluxV1Client(settings.influx.model_copy(update={"database": f"{settings.influx.database}_v2"}))
    assert client.query("SELECT count(mean) FROM device_metrics")
    client.close()


def test_running_job_picks_up_a_newly_approved_fleet_model_without_restart(
    spark, test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    import numpy as np
    from confluent_kafka import Producer

    from iotwatch.contract.telemetry import Telemetry
    from iotwatch.models.iforest import IsolationForest
    from iotwatch.models.registry import ModelRegistry
    from iotwatch.models.updates import UpdatePublisher

    settings = _job_settings(test_settings, trigger_interval_s=0.5, fleet_detector="isolation_forest")
    settings = settings.model_copy(update={"registry": settings.registry.model_copy(update={"path": tmp_path / "reg"})})
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    producer = Producer(settings.kafka.client_config())
    rng = np.random.default_rng(1)
    t0 = int(time.time() * 1000) - 600_000
    device = f"fleet-{unique}"

    def send(first: int, count: int, spike_at: int | None = None) -> None:
        for seq in range(first, first + count):
            temperature = 21 + float(rng.normal(0, 0.2)) + (9.0 if seq == spike_at else 0.0)
            message = Telemetry(
                v=1,
                device_id=device,
                device_type="thermostat",
                site="h",
                seq=seq,
                ts=t0 + seq * 1000,
                metrics={"temperature_c": temperature},
            )
            producer.produce(settings.topics.raw, key=device.encode(), value=message.to_json())
        producer.flush(10)

    job = start(
        spark, settings, checkpoint_dir=tmp_path / "ck", archive_dir=tmp_path / "archive", query_name=f"fleet_{unique}"
    )
    try:
        send(0, 100)
        wait_for(lambda: job.totals.get("reading_records", 0) >= 100, 120, "the first 100 readings")
        # a stop finds its moment between micro-batches by Spark's status text (job.PLANNING)
        deadline = time.monotonic() + 60
        while not job.query.status["message"].startswith(PLANNING):
            assert time.monotonic() < deadline, f"Spark never said {PLANNING!r}: a stop can only wait for a batch id"
            time.sleep(0.002)
        normal = np.random.default_rng(2).normal(21, 0.2, 3000)
        frame = pd.DataFrame({"temperature_c": normal})
        registry = ModelRegistry(
            settings.registry.path, publisher=UpdatePublisher(settings.kafka, settings.topics.model_updates)
        )
        version = registry.register(IsolationForest(seed=0).fit(frame, frame.shift(1).bfill()), "thermostat")
        registry.approve("thermostat", "isolation_forest", version.version)
        time.sleep(2)
        send(100, 30, spike_at=115)

        def fleet_alert() -> bool:
            return any(
                a["rule"] == "fleet_anomaly"
                and a["model_version"] == "isolation_forest@v1"
                and a["first_event_ms"] == t0 + 115_000
                for a in _alerts(settings)
            )

        wait_for(fleet_alert, 120, "the fleet model's alert")
        assert job.query.isActive
    finally:
        job.stop()


def test_poison_records_are_dead_lettered_and_the_job_goes_on(
    spark, test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    """One record of each kind that once stopped or wedged a component, straight into the
    raw topic (as the gateway, or any other producer, would put it there), then 100 valid
    readings: each poison record is a dead letter with its reason or handled as documented
    (a reading 23 h ahead is within the contract's skew and scored), and all 100 are scored
    and archived -- with fleet scoring on."""
    import msgspec
    from confluent_kafka import Producer

    from iotwatch.contract.telemetry import Telemetry

    settings = _job_settings(test_settings, fleet_detector="isolation_forest")
    settings = settings.model_copy(update={"registry": settings.registry.model_copy(update={"path": tmp_path / "reg"})})
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    now = int(time.time() * 1000)
    good, victim = f"good-{unique}", f"victim-{unique}"

    def message(device: str = f"poison-{unique}", **fields: object) -> bytes:
        body = {
            "v": 1,
            "device_id": device,
            "device_type": "thermostat",
            "site": "h1",
            "seq": 1,
            "ts": now - 60_000,
            "metrics": {"temperature_c": 20.0},
            **fields,
        }
        return json.dumps(body).encode()

    poison = [
        ("invalid_field", message(seq=2**63)),
        ("invalid_field", message(seq=-1)),
        ("invalid_field", message(device_type="a:b")),
        ("too_many_metrics", message(metrics={f"m{i}": 1.0 for i in range(1000)})),
        ("too_large", message(metrics={"temperature_c": 20.0, "x" * 300_000: 1.0})),
        ("invalid_json", b'{"device_id":' + b"[" * 5000 + b"]" * 5000 + b"}"),
        ("identity_conflict", message(victim, site="h2", seq=2)),
    ]
    producer = Producer(settings.kafka.client_config())
    producer.produce(settings.topics.raw, key=victim.encode(), value=message(victim, seq=1))
    for _, value in poison:
        key = victim if b"victim" in value[:200] else f"poison-{unique}"
        producer.produce(settings.topics.raw, key=key.encode(), value=value)
    ahead = Telemetry(
        v=1,
        device_id=f"ahead-{unique}",
        device_type="thermostat",
        site="h1",
        seq=1,
        ts=now + 23 * 3600 * 1000,
        metrics={"temperature_c": 20.0},
    )
    producer.produce(settings.topics.raw, key=ahead.device_id.encode(), value=ahead.to_json())
    # an older seq 23 h behind the device's newest reading: late, dead-lettered with its bytes read back from the log
    behind = msgspec.structs.replace(ahead, seq=0, ts=now - 60_000).to_json()
    producer.produce(settings.topics.raw, key=ahead.device_id.encode(), value=behind)
    for seq in range(100):
        reading = Telemetry(
            v=1,
            device_id=good,
            device_type="thermostat",
            site="h1",
            seq=seq,
            ts=now - 100_000 + seq * 1000,
            metrics={"temperature_c": 20.0 + seq % 3 * 0.1},
        )
        producer.produce(settings.topics.raw, key=good.encode(), value=reading.to_json())
    assert producer.flush(30) == 0

    job = start(spark, settings, checkpoint_dir=tmp_path / "ck", archive_dir=tmp_path / "archive", available_now=True)
    job.await_backlog(600)
    assert job.query.exception() is None
    assert job.totals["reading_records"] == 100 + 2  # the good device, the victim's first reading, the one ahead
    assert job.totals["dlq"] == len(poison)
    assert job.totals["late"] == 1
    dead = read_topic(settings.kafka, settings.topics.dlq, expected=len(poison) + 1, timeout_s=30, idle_s=3)
    # each dead letter holds its record's original bytes: kept by the packing step for the records
    # the decoder rejected, read back from the raw topic for the conflict and the late one
    letters = sorted((header_value(m.headers(), H_REASON), m.value()) for m in dead)
    assert letters == sorted([*poison, ("late", behind)])
    assert {header_value(m.headers(), H_KAFKA_TOPIC) for m in dead} == {settings.topics.raw}
    archive = pd.read_parquet(tmp_path / "archive" / "readings")
    assert sorted(archive[archive["device_id"] == good]["seq"]) == list(range(100))


def test_influxdb_outage_is_counted_and_loses_nothing_from_kafka_or_the_archive(
    spark, test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    """InfluxDB stopped for 20 s under a running job: the job goes on, the failed writes
    are counted (metrics are derived data), every reading reaches the archive, and after
    InfluxDB is back the job writes to it again."""
    import threading

    from confluent_kafka import Producer

    from iotwatch.application.stack.influxdb import start_influxdb
    from iotwatch.application.stack.process import start_process, stop_process
    from iotwatch.contract.telemetry import Telemetry

    influx = start_influxdb(tmp_path / "influx", f"outage_{unique}", timeout_s=60)
    settings = _job_settings(test_settings, trigger_interval_s=0.5, aggregate_interval_s=1)
    settings = settings.model_copy(
        update={"influx": settings.influx.model_copy(update={"url": influx.endpoint, "database": f"outage_{unique}"})}
    )
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    devices = [f"out-{unique}-{d}" for d in range(5)]
    sent = {d: [] for d in devices}
    stop = threading.Event()

    def produce() -> None:
        producer = Producer(settings.kafka.client_config())
        seq = 0
        while not stop.is_set():
            for device in devices:
                reading = Telemetry(
                    v=1,
                    device_id=device,
                    device_type="thermostat",
                    site="h1",
                    seq=seq,
                    ts=int(time.time() * 1000),
                    metrics={"temperature_c": 21.0 + seq % 5 * 0.1},
                )
                producer.produce(settings.topics.raw, key=device.encode(), value=reading.to_json())
                sent[device].append(seq)
            producer.poll(0)
            seq += 1
            time.sleep(0.05)
        assert producer.flush(30) == 0

    job = start(
        spark, settings, checkpoint_dir=tmp_path / "ck", archive_dir=tmp_path / "archive", query_name=f"outage_{unique}"
    )
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for(lambda: job.totals.get("reading_records", 0) >= 100, 180, "the first 100 readings")
        client = InfluxV1Client(settings.influx)
        points = f"SELECT count(mean) FROM device_metrics WHERE device_id = '{devices[0]}'"

        def count() -> int:
            try:
                series = client.query(points)
            except IotwatchError:  # down, or still starting
                return -1
            return int(series[0]["values"][0][1]) if series else 0

        wait_for(lambda: count() > 0, 180, "aggregates in InfluxDB")
        stop_process(influx.process)
        down_since = time.monotonic()
        wait_for(lambda: job.totals.get("influx_write_failures", 0) >= 1, 60, "a counted InfluxDB failure")
        time.sleep(max(0.0, 20 - (time.monotonic() - down_since)))
        restarted = start_process(
            "influx",
            influx.process.command,  # its own config
            tmp_path / "influx" / "influxdb" / "influxd-2.log",
        )
        failures = job.totals["influx_write_failures"]
        wait_for(lambda: count() >= 0, 60, "InfluxDB up again")
        back = count()
        wait_for(lambda: count() > back, 120, "the job writing to InfluxDB again")
        stop.set()
        producer.join()
        total = sum(len(s) for s in sent.values())
        wait_for(lambda: job.totals.get("reading_records", 0) >= total, 180, "every reading")
        assert job.query.isActive and job.query.exception() is None
        assert job.totals["reading_records"] == total and failures >= 1
    finally:
        stop.set()
        producer.join()
        job.stop()
        stop_process(influx.process)
        if "restarted" in locals():
            stop_process(restarted)
    archive = pd.read_parquet(tmp_path / "archive" / "readings").drop_duplicates(["device_id", "seq"])
    assert archive.groupby("device_id")["seq"].apply(sorted).to_dict() == sent
