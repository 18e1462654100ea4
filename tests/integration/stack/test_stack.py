"""The embedded stack answers real clients, including third-party ones, and stops cleanly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
import psutil
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from paho.mqtt.enums import CallbackAPIVersion

from iotwatch.application.stack import StackState
from iotwatch.clients.influx import InfluxV1Client
from iotwatch.clients.kafka import end_offset, ensure_topics, list_topics
from iotwatch.jvm.jars import KAFKA_VERSION
from iotwatch.settings import KafkaSettings, Settings, TopicSettings
from tests.helpers import user_env

IOTWATCH = [sys.executable, "-m", "iotwatch.application"]


def test_paho_publish_subscribe_round_trip(stack_settings: Settings, unique: str) -> None:
    mqtt = stack_settings.mqtt
    topic = f"iot/test-{unique}/thermostat/t1/telemetry"
    received: list[bytes] = []
    done = threading.Event()
    subscribed = threading.Event()

    def on_message(_client: paho.Client, _userdata: object, message: paho.MQTTMessage) -> None:
        received.append(message.payload)
        if len(received) == 10:
            done.set()

    sub = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"sub-{unique}")
    sub.on_message = on_message
    sub.on_subscribe = lambda *_: subscribed.set()
    sub.connect(mqtt.host, mqtt.port)
    sub.loop_start()
    sub.subscribe(topic, qos=1)
    assert subscribed.wait(5)
    pub = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"pub-{unique}")
    pub.connect(mqtt.host, mqtt.port)
    pub.loop_start()
    for i in range(10):
        pub.publish(topic, json.dumps({"seq": i}).encode(), qos=1).wait_for_publish(5)
    assert done.wait(5)
    assert [json.loads(p)["seq"] for p in received] == list(range(10))
    for client in (pub, sub):
        client.disconnect()
        client.loop_stop()


def test_kafka_round_trip_on_created_topic_with_four_partitions(stack_settings: Settings, unique: str) -> None:
    kafka = stack_settings.kafka
    topic = f"test.{unique}.roundtrip"
    assert ensure_topics(kafka, [topic]) == [topic]
    assert list_topics(kafka)[topic] == 4
    assert ensure_topics(kafka, [topic]) == []  # idempotent

    producer = Producer({**kafka.client_config(), "enable.idempotence": True, "acks": "all"})
    sent = {f"device-{d}": [f"{d}:{i}" for i in range(25)] for d in range(8)}
    for key, values in sent.items():
        for value in values:
            producer.produce(topic, key=key.encode(), value=value.encode())
    assert producer.flush(10) == 0

    consumer = Consumer({**kafka.client_config(), "group.id": f"g-{unique}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
    got: dict[str, list[str]] = {}
    partitions_seen: set[int] = set()
    deadline = time.monotonic() + 20
    while sum(map(len, got.values())) < 200 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None or message.error():
            continue
        got.setdefault(message.key().decode(), []).append(message.value().decode())
        partitions_seen.add(message.partition())
    ends = [end_offset(consumer, TopicPartition(topic, p)) for p in range(4)]
    consumer.close()
    assert sum(ends) == 200  # the log ends, as a probe that only watches the topic reads them
    assert got == sent  # every record once, in order per key
    assert len(partitions_seen) > 1  # keys really spread over partitions


def test_influxd_restarts_with_its_collector_setting(tmp_path: Path) -> None:
    """GOGC is in influxd's command, so a restart after kill -9 (chaos) keeps the smaller heap."""
    from iotwatch.application.stack.influxdb import GOGC, start_influxdb
    from iotwatch.application.stack.process import restart_process, stop_process

    first = start_influxdb(tmp_path, "gogc", timeout_s=60).process
    stop_process(first)
    restarted = restart_process(first)
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(restarted.pid).name() != "influxd" and time.monotonic() < deadline:
            time.sleep(0.05)  # env execs influxd in the same process
        assert psutil.Process(restarted.pid).environ()["GOGC"] == GOGC
    finally:
        stop_process(restarted)


def test_influx_line_protocol_write_read_back_with_influxql(stack_settings: Settings, unique: str) -> None:
    client = InfluxV1Client(stack_settings.influx)
    now_ms = int(time.time() * 1000)
    client.write_lines([f"stack_test,run={unique} value={i}i {now_ms - 1000 * i}" for i in range(5)])
    series = client.query(f"SELECT sum(value), count(value) FROM stack_test WHERE run = '{unique}'")
    client.close()
    assert series and series[0]["values"][0][1:] == [10, 5]


@pytest.mark.skipif(
    shutil.which("mosquitto_pub") is None and os.environ.get("CI") != "true",
    reason="mosquitto-clients not installed (CI installs it)",
)
def test_third_party_clients_use_stack_up_json_endpoints(tmp_path: Path, unique: str) -> None:
    """`stack up --json` endpoints work as they are with mosquitto_pub/sub, kafka-python and curl;
    `stack down` leaves no process behind."""
    run_dir = tmp_path / "run"
    env = user_env()
    up = subprocess.run(
        [*IOTWATCH, "stack", "up", "--run-dir", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    assert state["services"]["kafka"]["implementation"] == f"apache-kafka {KAFKA_VERSION}"
    pids = [svc["process"]["pid"] for svc in state["services"].values()]
    try:
        ends = state["endpoints"]
        # MQTT: mosquitto_sub receives what mosquitto_pub sends, using the URL as printed.
        topic = f"iot/s-{unique}/door_sensor/d1/telemetry"
        sub = subprocess.Popen(
            ["mosquitto_sub", "-L", f"{ends['mqtt']}/{topic}", "-C", "1", "-W", "10"], stdout=subprocess.PIPE, text=True
        )
        time.sleep(0.5)
        deadline = time.monotonic() + 8
        while sub.poll() is None and time.monotonic() < deadline:
            subprocess.run(["mosquitto_pub", "-L", f"{ends['mqtt']}/{topic}", "-m", "hello", "-q", "1"], check=True)
            time.sleep(0.3)
        assert sub.wait(10) == 0 and sub.stdout is not None and sub.stdout.read().strip() == "hello"

        # Kafka: kafka-python (not the project's client) produces and consumes on a created topic.
        from kafka import KafkaConsumer, KafkaProducer
        from kafka import TopicPartition as KTopicPartition

        producer = KafkaProducer(bootstrap_servers=ends["kafka"])
        producer.send("iot.telemetry.raw", key=b"d1", value=b"from-kafka-python").get(timeout=10)
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=ends["kafka"], consumer_timeout_ms=10000)
        assignment = [KTopicPartition("iot.telemetry.raw", p) for p in range(state["partitions"])]
        consumer.assign(assignment)
        consumer.seek_to_beginning(*assignment)
        values = [record.value for record in consumer]
        consumer.close()
        assert b"from-kafka-python" in values
        # the broker's garbage collector logs beside its log, as Kafka's start script has it
        assert "Using G1" in (run_dir / "kafka" / "kafkaServer-gc.log").read_text()

        # InfluxDB: curl writes line protocol and reads it back with InfluxQL.
        influx, db = ends["influx"], state["influx_database"]
        subprocess.run(
            ["curl", "-sf", "-XPOST", f"{influx}/write?db={db}", "--data-binary", "curl_test value=42"], check=True
        )
        out = subprocess.run(
            [
                "curl",
                "-sfG",
                f"{influx}/query",
                "--data-urlencode",
                f"db={db}",
                "--data-urlencode",
                "q=SELECT last(value) FROM curl_test",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        assert json.loads(out)["results"][0]["series"][0]["values"][0][1] == 42

        status = subprocess.run(
            [*IOTWATCH, "stack", "status", "--run-dir", str(run_dir), "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert status.returncode == 0 and json.loads(status.stdout)["up"] is True
    finally:
        down = subprocess.run(
            [*IOTWATCH, "stack", "down", "--run-dir", str(run_dir), "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    assert down.returncode == 0, down.stderr
    assert sorted(json.loads(down.stdout)["stopped"]) == sorted(state["services"])
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert not (run_dir / "stack.json").exists()


def test_failed_start_stops_what_was_already_started(tmp_path: Path, base_settings: Settings) -> None:
    """A failure part-way (here: influxd asked for but its config dir unwritable) leaves nothing running."""
    from iotwatch.application.stack import EmbeddedStack
    from iotwatch.errors import StackError

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "influxdb").write_text("a file where influxd wants a directory")
    settings = base_settings.model_copy(
        update={"stack": base_settings.stack.model_copy(update={"influxdb": "influxd"})}
    )
    before = {p.pid for p in psutil.process_iter()}
    with pytest.raises((StackError, OSError)):
        EmbeddedStack(settings, run_dir).up()
    leftovers = [  # servers of this run directory (other tests may start their own meanwhile)
        p
        for p in psutil.process_iter(["cmdline"])
        if p.pid not in before and any(str(run_dir) in part for part in (p.info["cmdline"] or []))
    ]
    assert not leftovers
    assert StackState.load(run_dir) is None


def test_second_up_on_a_running_run_dir_is_refused(stack: StackState, base_settings: Settings) -> None:
    from iotwatch.application.stack import EmbeddedStack
    from iotwatch.errors import StackError

    with pytest.raises(StackError, match="already running"):
        EmbeddedStack(base_settings, stack.run_dir).up()


def test_cli_errors_are_one_line_on_stderr(tmp_path: Path) -> None:
    result = subprocess.run(
        [*IOTWATCH, "stack", "status", "--run-dir", str(tmp_path / "none")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and "no stack" in result.stdout
    bad = subprocess.run(
        [*IOTWATCH, "--config", str(tmp_path / "missing.toml"), "stack", "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("iotwatch: error:")
    assert "missing.toml" in bad.stderr


def test_stack_up_prints_its_stop_command_and_status_and_down_find_it_without_run_dir(tmp_path: Path) -> None:
    env = user_env(home=tmp_path / "home")
    run_dir = (tmp_path / "my-stack").resolve()
    up = subprocess.run(
        [*IOTWATCH, "stack", "up", "--run-dir", str(run_dir), "--no-influx"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert up.returncode == 0, up.stderr
        assert f"stop it with: iotwatch stack down --run-dir {run_dir}" in up.stdout.splitlines()
        status = subprocess.run(
            [*IOTWATCH, "stack", "status", "--json"], env=env, capture_output=True, text=True, timeout=60
        )
        assert status.returncode == 0, status.stdout + status.stderr
        assert json.loads(status.stdout)["run_dir"] == str(run_dir)
    finally:
        down = subprocess.run(
            [*IOTWATCH, "stack", "down", "--json"], env=env, capture_output=True, text=True, timeout=60
        )
    assert down.returncode == 0 and set(json.loads(down.stdout)["stopped"]) == {"mqtt", "kafka"}, down.stderr
    after = subprocess.run([*IOTWATCH, "stack", "status"], env=env, capture_output=True, text=True, timeout=60)
    assert after.returncode == 1 and "no stack in" in after.stdout


def test_a_three_node_stack_replicates_every_topic_and_takes_writes_with_a_node_killed(tmp_path: Path) -> None:
    """``stack up --kafka-nodes 3``: every pipeline topic has three replicas, the exports name
    every node and the replication factor, and with one node killed writes acknowledged by
    all in-sync replicas still succeed and read back; ``stack status`` names the dead node."""
    env = user_env(home=tmp_path / "home")
    run_dir = (tmp_path / "cluster").resolve()
    up = _iotwatch(env, "stack", "up", "--run-dir", str(run_dir), "--no-influx", "--kafka-nodes", "3", "--json")
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads(up.stdout)
        nodes = ["kafka", "kafka-2", "kafka-3"]
        assert [role for role in state["services"] if role.startswith("kafka")] == nodes
        bootstrap = state["endpoints"]["kafka"]
        assert bootstrap.split(",") == [state["services"][role]["endpoint"] for role in nodes]
        assert state["env"]["IOTWATCH_KAFKA_BOOTSTRAP_SERVERS"] == bootstrap
        assert state["env"]["IOTWATCH_KAFKA_REPLICATION_FACTOR"] == "3"
        kafka = KafkaSettings(bootstrap_servers=bootstrap)
        metadata = AdminClient(kafka.client_config()).list_topics(timeout=30).topics
        for topic in state["topics"]:
            assert {len(p.replicas) for p in metadata[topic].partitions.values()} == {3}, topic

        psutil.Process(state["services"]["kafka-2"]["process"]["pid"]).kill()
        topic = TopicSettings().raw
        producer = Producer({**kafka.client_config(), "acks": "all", "message.timeout.ms": 60000})
        failed: list[str] = []
        for i in range(200):
            producer.produce(
                topic,
                key=f"d{i % 20}",
                value=f"{i}",
                on_delivery=lambda err, _: failed.append(str(err)) if err else None,
            )
        assert producer.flush(90) == 0 and not failed, failed
        consumer = Consumer({**kafka.client_config(), "group.id": "three-nodes", "auto.offset.reset": "earliest"})
        partitions = list(metadata[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        values: set[str] = set()
        deadline = time.monotonic() + 90
        while len(values) < 200 and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and not message.error():
                values.add(message.value().decode())
        consumer.close()
        assert values == {str(i) for i in range(200)}

        status = _iotwatch(env, "stack", "status", "--run-dir", str(run_dir), "--json")
        services = json.loads(status.stdout)["services"]
        assert status.returncode == 1
        assert {role: services[role]["healthy"] for role in nodes} == {"kafka": True, "kafka-2": False, "kafka-3": True}
    finally:
        _iotwatch(env, "stack", "down", "--run-dir", str(run_dir))


def _iotwatch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*IOTWATCH, *args], env=env, capture_output=True, text=True, timeout=240)


def test_one_server_stops_and_starts_on_its_port_and_up_revives_only_the_dead(tmp_path: Path) -> None:
    """``stack stop|start|restart SERVICE`` touch one server, which comes back where its
    clients expect it; ``stack up`` on a half-dead stack starts only what died."""
    env = user_env(home=tmp_path / "home")
    run_dir = str((tmp_path / "one").resolve())

    def iotwatch(*args: str) -> dict[str, object]:
        done = subprocess.run(
            [*IOTWATCH, "stack", *args, "--run-dir", run_dir, "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    up = iotwatch("up", "--no-influx")
    try:
        ends = up["endpoints"]
        mqtt_pid = up["services"]["mqtt"]["process"]["pid"]
        stopped = iotwatch("stop", "kafka")
        assert stopped["outcome"] == "stopped" and not stopped["running"]
        assert not psutil.pid_exists(stopped["pid"]) or psutil.Process(stopped["pid"]).status() == "zombie"
        assert iotwatch("stop", "kafka")["outcome"] == "was not running"
        revived = iotwatch("up", "--no-influx")  # half-dead: only Kafka starts again
        assert revived["endpoints"] == ends
        assert revived["services"]["mqtt"]["process"]["pid"] == mqtt_pid
        assert revived["services"]["kafka"]["process"]["pid"] != stopped["pid"]
        assert list_topics(KafkaSettings(bootstrap_servers=ends["kafka"]))  # serves clients again
        assert iotwatch("start", "kafka")["outcome"] == "was running already"
        restarted = iotwatch("restart", "mqtt")
        assert restarted["outcome"] == "restarted" and restarted["pid"] != mqtt_pid and restarted["running"]
        assert f"mqtt://{restarted['endpoint'].split('//')[1]}" == ends["mqtt"]
        unknown = subprocess.run(
            [*IOTWATCH, "stack", "stop", "zookeeper", "--run-dir", run_dir], env=env, capture_output=True, text=True
        )
        assert unknown.returncode == 1 and "mqtt, kafka" in unknown.stderr
    finally:
        subprocess.run([*IOTWATCH, "stack", "down", "--run-dir", run_dir], env=env, capture_output=True, timeout=60)
