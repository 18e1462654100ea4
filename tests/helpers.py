"""Small test helpers that talk to the real servers (publish readings, read topics back)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Consumer, Message, TopicPartition
from paho.mqtt.client import MQTT_ERR_NO_CONN

from iotwatch.clients.mqtt import make_client
from iotwatch.contract.device_topics import telemetry_topic
from iotwatch.contract.ground_truth import ANOMALY, Injection
from iotwatch.contract.telemetry import Telemetry
from iotwatch.jvm import class_data
from iotwatch.jvm.jars import jars_root
from iotwatch.settings import KafkaSettings, MqttSettings


def children_running(pid: int, command_part: str) -> list[psutil.Process]:
    """The descendants of ``pid`` whose command line holds ``command_part`` (those gone or
    already zombies are left out)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if command_part in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


#: The main class of the JVM that ``pyspark`` (through ``spark-submit``) starts for a session.
SPARK_SUBMIT_CLASS = "org.apache.spark.deploy.SparkSubmit"


def spark_jvms(pid: int) -> list[psutil.Process]:
    """The Spark driver JVMs among the descendants of ``pid`` (:func:`children_running`)."""
    return children_running(pid, SPARK_SUBMIT_CLASS)


def user_env(home: Path | None = None) -> dict[str, str]:
    """The environment of a command run as a user runs it: none of the developer's IOTWATCH_*
    settings, but the Java artifacts `iotwatch setup` installed and the Spark driver's
    class-data archives (found where this process finds them, whatever HOME is); ``home``: a
    HOME of the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOTWATCH_")}
    env["IOTWATCH_JARS_DIR"] = str(jars_root())
    env["IOTWATCH_CLASS_DATA_DIR"] = str(class_data.folder() or "")  # one archive for every test's JVM
    if home is not None:
        env["HOME"] = str(home)
    return env


def reading(
    device: str,
    seq: int,
    *,
    site: str = "home-1",
    device_type: str = "thermostat",
    ts: int | None = None,
    value: float = 21.0,
) -> Telemetry:
    return Telemetry(
        v=1,
        device_id=device,
        device_type=device_type,
        site=site,
        seq=seq,
        ts=ts if ts is not None else int(time.time() * 1000),
        metrics={"temperature_c": value},
    )


@dataclass
class Publisher:
    """Publishes contract-valid readings at QoS 1 from a background thread."""

    mqtt: MqttSettings
    devices: list[str]
    count: int
    rate_per_s: float = 0.0  # 0 = as fast as possible
    site: str = "home-1"
    published: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # device -> (seq, time)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def start(self) -> Publisher:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._publish_all()
        except BaseException as exc:  # reported by join(), not lost in the thread
            self.error = exc
        finally:
            self.done.set()

    def _publish_all(self) -> None:
        acknowledged = threading.Semaphore(0)
        client = make_client(self.mqtt, f"test-pub-{id(self)}")
        client.on_publish = lambda *_: acknowledged.release()
        client.max_queued_messages_set(0)
        client.connect(self.mqtt.host, self.mqtt.port)
        client.loop_start()
        started = time.monotonic()
        sent = 0
        for seq in range(self.count):
            for device in self.devices:
                message = reading(device, seq, site=self.site)
                # Not connected (the broker restarting): paho keeps it and sends it after reconnecting.
                info = client.publish(telemetry_topic(self.site, "thermostat", device), message.to_json(), qos=1)
                assert info.rc in (0, MQTT_ERR_NO_CONN), info.rc
                self.published.setdefault(device, []).append((seq, time.time()))
                sent += 1
                if self.rate_per_s:
                    delay = started + sent / self.rate_per_s - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
        # Every PUBACK, not the last message's: that one may have been published while the
        # broker was down (rc NO_CONN), and paho's wait_for_publish raises for it although
        # paho sends it after the reconnect.
        deadline = time.monotonic() + 90
        for count in range(sent):
            left = max(0.0, deadline - time.monotonic())
            assert acknowledged.acquire(timeout=left), f"{count} of {sent} readings acknowledged"
        client.disconnect()
        client.loop_stop()

    def join(self, timeout: float = 120) -> None:
        assert self.done.wait(timeout), "publisher did not finish"
        if self.error is not None:
            raise AssertionError(f"publisher failed: {self.error!r}") from self.error


def injection(
    kind: str,
    device: str,
    start_seq: int,
    end_seq: int,
    *,
    device_type: str = "thermostat",
    interval_ms: int = 1000,
    t0_ms: int = 0,
    **fields: Any,
) -> Injection:
    """A ground-truth record as the simulators write it: an anomaly (``category`` in
    ``fields`` for a transport fault) over seqs ``start_seq``..``end_seq``, a reading every
    ``interval_ms`` from ``t0_ms`` at seq 0."""
    values: dict[str, Any] = {
        "device_id": device,
        "device_type": device_type,
        "site": "h",
        "kind": kind,
        "category": ANOMALY,
        "start_ts": t0_ms + start_seq * interval_ms,
        "end_ts": t0_ms + end_seq * interval_ms,
        "start_seq": start_seq,
        "end_seq": end_seq,
        "messages": end_seq - start_seq + 1,
        "source": "rate",
        **fields,
    }
    return Injection(**values)


def read_topic(
    kafka: KafkaSettings,
    topic: str,
    *,
    expected: int | None = None,
    timeout_s: float = 30,
    idle_s: float = 3.0,
    partitions: int | None = None,
) -> list[Message]:
    """Every record of ``topic`` from the beginning: until ``expected`` arrived, or (without
    ``expected``) until the topic's end offsets as of the call are read and then nothing new
    came for ``idle_s``. (Idle time alone ends a read early on a loaded machine, where a
    fetch can take longer than ``idle_s``.)"""
    from iotwatch.clients.kafka import end_offset, list_topics

    count = partitions or list_topics(kafka)[topic]
    consumer = Consumer(
        {**kafka.client_config(), "group.id": f"reader-{time.monotonic_ns()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(count)])
    ends = {p: end_offset(consumer, TopicPartition(topic, p), timeout_s=10.0) for p in range(count)}
    records: list[Message] = []
    deadline = time.monotonic() + timeout_s
    last_new = time.monotonic()

    def at_ends() -> bool:
        positions = consumer.position([TopicPartition(topic, p) for p in ends])
        return all(tp.offset >= ends[tp.partition] or ends[tp.partition] == 0 for tp in positions)

    try:
        while time.monotonic() < deadline:
            if expected is not None and len(records) >= expected:
                break
            if expected is None and time.monotonic() - last_new > idle_s and at_ends():
                break
            batch = consumer.consume(1000, 0.5)
            fresh = [m for m in batch if m.error() is None]
            if fresh:
                records.extend(fresh)
                last_new = time.monotonic()
    finally:
        consumer.close()
    return records


def seqs_by_device(records: Iterable[Message]) -> dict[str, list[int]]:
    """Device -> seqs in Kafka order (records of one key share a partition, so order is meaningful)."""
    import json

    ordered: dict[str, list[int]] = {}
    for record in sorted(records, key=lambda m: (m.partition(), m.offset())):
        body = json.loads(record.value())
        ordered.setdefault(body["device_id"], []).append(body["seq"])
    return ordered


class InThread:
    """A service's ``run()`` in a thread, stopped the way SIGTERM stops it (its stop event);
    ``make(stop)`` builds the service."""

    def __init__(self, make: Any) -> None:
        self.stop = threading.Event()
        self.result: dict[str, Any] = {}
        self.service = make(self.stop)
        self.thread = threading.Thread(target=lambda: self.result.update(self.service.run()), daemon=True)
        self.thread.start()

    def close(self) -> dict[str, Any]:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the service did not stop"
        return self.result


def read_all_seqs(
    kafka: KafkaSettings, topic: str, devices: list[str], count: int, timeout_s: float = 120
) -> tuple[list[Message], dict[str, list[int]]]:
    """Read ``topic`` until every device has seqs 0..count-1 (duplicates allowed) or the
    timeout; the records and the seqs per device, for the caller to assert on."""
    deadline = time.monotonic() + timeout_s
    records = read_topic(kafka, topic, expected=count * len(devices), timeout_s=min(60, timeout_s))
    while time.monotonic() < deadline and any(
        len(set(seqs_by_device(records).get(device, ()))) < count for device in devices
    ):
        records = read_topic(kafka, topic, timeout_s=30, idle_s=2)
    return records, seqs_by_device(records)


def assert_no_loss(seqs: dict[str, list[int]], devices: list[str], count: int) -> None:
    """Every device has every seq from 0 to count-1 at least once."""
    for device in devices:
        missing = set(range(count)) - set(seqs.get(device, ()))
        assert not missing, f"{device}: {len(missing)} seq(s) missing, e.g. {sorted(missing)[:10]}"


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` until it holds, or fail naming ``what`` was awaited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
