"""What a real Apache Kafka broker enforces, and that the product lives with it:

- retention: a topic past its ``retention.ms`` loses its old segments;
- compaction: the alert-state, silences and twin topics keep only the newest value per key
  once the cleaner ran, and the forwarder and the twin reader rebuild their state from that;
- SCRAM and ACLs as ``iotwatch provision topics --acls`` grants them (as compose runs it):
  each service user does its job and is refused the rest, in one line naming the user, the
  operation and the topic; an unknown user or a wrong password cannot connect.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import NewTopic
from pydantic import SecretStr

from iotwatch.alerts.actions import acknowledge, add_silence, revoke_silence
from iotwatch.alerts.book import load_book
from iotwatch.alerts.dispatch import Dispatcher
from iotwatch.alerts.routing import parse_routing
from iotwatch.application.provision.kafka_acls import service_grants
from iotwatch.application.stack.kafka_broker import ADMIN_USER, SCRAM_MECHANISM, KafkaSecurity, start_kafka_broker
from iotwatch.application.stack.process import stop_process
from iotwatch.clients.kafka import (
    TopicFollower,
    admin_client,
    client_config,
    ensure_topics,
    list_topics,
    produce_confirmed,
    read_to_end,
)
from iotwatch.clients.mqtt import PersistentSession
from iotwatch.contract.alerts import alert_message
from iotwatch.contract.detection import Rule
from iotwatch.contract.device_commands import COMMAND_SCHEMA_VERSION, TwinProperties, TwinReport
from iotwatch.contract.device_commands import encode as encode_report
from iotwatch.contract.device_topics import twin_reported_topic
from iotwatch.contract.oncall import AlertState, AlertStep, CommandAudit, Emergency, Matchers, Silence, TwinRecord
from iotwatch.contract.oncall import decode as decode_record
from iotwatch.errors import AccessRefused
from iotwatch.responder.policy import CommandPolicy
from iotwatch.responder.service import Responder
from iotwatch.responder.twin_ops import parse_assignments, read_twin, set_desired
from iotwatch.settings import AlertsSettings, KafkaSettings, Settings, TopicSettings
from tests.helpers import InThread, user_env, wait_for
from tests.support.alerts import make_alert, produce

#: Segments roll this often (a record arriving later starts a new one), so the cleaner and the
#: retention check, which never touch the active segment, get closed segments to work on.
SEGMENT_MS = 500
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": str(SEGMENT_MS),
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
}


def create_topic(kafka: KafkaSettings, name: str, config: dict[str, str]) -> None:
    """One partition, so one roll closes every key's segment."""
    admin = admin_client(kafka)
    for future in admin.create_topics([NewTopic(name, num_partitions=1, config=config)]).values():
        future.result(timeout=30)


def low_watermark(kafka: KafkaSettings, topic: str) -> int:
    consumer = Consumer({**client_config(kafka), "group.id": f"watermarks-{time.time_ns()}"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0])
    finally:
        consumer.close()


# --- retention ---------------------------------------------------------------------------


def test_retention_deletes_the_segments_older_than_retention_ms(test_settings: Settings, unique: str) -> None:
    kafka, topic = test_settings.kafka, f"test.{unique}.retention"
    create_topic(kafka, topic, {"retention.ms": "3000", "segment.ms": str(SEGMENT_MS)})
    producer = Producer({**client_config(kafka), "enable.idempotence": True})
    for i in range(20):
        producer.produce(topic, f"old-{i}".encode(), key=b"k")
    assert producer.flush(30) == 0
    assert low_watermark(kafka, topic) == 0

    # Fresh records keep arriving (and rolling segments) while the broker's check (every 5 s)
    # deletes what is older than 3 s.
    deadline, fresh = time.monotonic() + 40, 0
    while low_watermark(kafka, topic) < 20 and time.monotonic() < deadline:
        producer.produce(topic, f"fresh-{fresh}".encode(), key=b"k")
        fresh += 1
        assert producer.flush(30) == 0
        time.sleep(0.5)
    assert low_watermark(kafka, topic) >= 20, "the old segment was not deleted within 40 s"
    producer.produce(topic, b"newest", key=b"k")
    assert producer.flush(30) == 0

    # from the beginning: none of the old records, and no gap among the recent ones
    values = [m.value().decode() for m in read_to_end(kafka, topic)]
    first = fresh - (len(values) - 1)
    assert first >= 0 and values == [f"fresh-{i}" for i in range(first, fresh)] + ["newest"]


# --- compaction --------------------------------------------------------------------------


def compacted_settings(test_settings: Settings) -> Settings:
    """``test_settings`` whose on-call topics exist already, compacted with small segments."""
    topics = test_settings.topics
    for name in (topics.alert_state, topics.silences, topics.device_twin):
        create_topic(test_settings.kafka, name, COMPACTED)
    return test_settings


def wait_compacted(kafka: KafkaSettings, topic: str, timeout_s: float = 60) -> list[Message]:
    """The topic once it holds one record per key (the cleaner ran over its closed segments)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = read_to_end(kafka, topic)
        keys = [m.key() for m in records]
        if len(keys) == len(set(keys)):
            return records
        assert time.monotonic() < deadline, (
            f"{topic}: {len(keys)} records for {len(set(keys))} keys after {timeout_s} s"
        )
        time.sleep(1)


def test_compaction_keeps_the_newest_ack_silence_and_twin_and_restarts_rebuild_from_them(
    test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    settings = compacted_settings(test_settings)
    topics, kafka = settings.topics, settings.kafka
    alerts = [
        make_alert(f"hvac-{unique}-{i}", "thermostat", "home-1", Rule.STUCK_HVAC, "major", "raised", 1_000 * i)
        for i in range(3)
    ]
    produce(kafka, topics.alerts, list(alerts))

    # several values per key, through the operators' own commands
    book = load_book(settings)
    for alert in alerts[:2]:
        acknowledge(settings, book, alert.alert_id, "alice", "looking")
        acknowledge(settings, book, alert.alert_id, "bob", "not mine", action=AlertStep.UNACKNOWLEDGED)
        acknowledge(settings, book, alert.alert_id, "carol", "on it")
    silences = [add_silence(settings, Matchers(site=f"home-{i}"), 3600, "alice") for i in range(2)]
    for silence in silences:
        book.apply_silence(silence)
        revoke_silence(settings, book, silence.silence_id, "bob")
    devices = [f"thermo-{unique}-{i}" for i in range(2)]
    for device in devices:
        for setpoint in ("19.0", "20.5", "21.5"):
            set_desired(
                settings, device, parse_assignments((f"setpoint_c={setpoint}",)), "alice", 60, "home-1", "thermostat"
            )

    # one more record per topic after segment.ms rolls the segment holding all of the above
    time.sleep(SEGMENT_MS * 2 / 1000)
    acknowledge(settings, book, alerts[2].alert_id, "dave")
    extra_silence = add_silence(settings, Matchers(site="home-9"), 3600, "alice")
    set_desired(settings, f"thermo-{unique}-x", TwinProperties(setpoint_c=18.0), "alice", 60, "home-1", "thermostat")

    acks = {m.key().decode(): decode_record(m.value(), AlertState) for m in wait_compacted(kafka, topics.alert_state)}
    assert {k: (a.by, a.action) for k, a in acks.items()} == {
        alerts[0].alert_id: ("carol", AlertStep.ACKNOWLEDGED),
        alerts[1].alert_id: ("carol", AlertStep.ACKNOWLEDGED),
        alerts[2].alert_id: ("dave", AlertStep.ACKNOWLEDGED),
    }
    kept = {m.key().decode(): decode_record(m.value(), Silence) for m in wait_compacted(kafka, topics.silences)}
    assert set(kept) == {s.silence_id for s in silences} | {extra_silence.silence_id}
    assert all(kept[s.silence_id].revoked_by == "bob" for s in silences)
    twins = [decode_record(m.value(), TwinRecord) for m in wait_compacted(kafka, topics.device_twin)]
    assert sorted((t.device_id, t.version, t.properties.setpoint_c) for t in twins) == sorted(
        [(device, 3, 21.5) for device in devices] + [(f"thermo-{unique}-x", 1, 18.0)]
    )

    # a forwarder started now rebuilds the acknowledgements and silences from the compacted topics
    tree = parse_routing(
        {
            "receivers": {"pager": {"url": "http://127.0.0.1:9/never"}},
            "route": {"receiver": "pager", "group_wait": "1h"},
        }
    )
    forwarder = Dispatcher(settings, AlertsSettings(state_dir=tmp_path), tree, threading.Event())
    forwarder.run(timeout_s=0.5)
    assert {a.alert_id: forwarder.book.alerts[a.alert_id].status for a in alerts} == {
        a.alert_id: "acknowledged" for a in alerts
    }
    assert forwarder.book.alerts[alerts[0].alert_id].ack.by == "carol"  # type: ignore[union-attr]
    now_ms = int(time.time() * 1000)
    assert [s.silence_id for s in forwarder.book.silences.values() if s.ends_at_ms > now_ms] == [
        extra_silence.silence_id
    ]
    # ... and the operators' twin reader has each device's newest desired properties
    for device in devices:
        desired = read_twin(settings, device).desired
        assert desired is not None and (desired.version, desired.properties.setpoint_c) == (3, 21.5)


# --- SCRAM users and ACLs ----------------------------------------------------------------

SERVICE_USERS = ("gateway", "stream", "responder")


def user_settings(endpoint: str, user: str, password: str) -> KafkaSettings:
    """A client of ``endpoint`` as ``user``, configured as compose configures its services."""
    return KafkaSettings(
        bootstrap_servers=endpoint,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=SCRAM_MECHANISM,
        sasl_username=user,
        sasl_password=SecretStr(password),
    )


def iotwatch(kafka: KafkaSettings, *args: str) -> subprocess.CompletedProcess[str]:
    """The real command line, configured only by the environment (as compose configures it)."""
    env = user_env()
    env.update(kafka.as_environment())
    return subprocess.run(
        [sys.executable, "-m", "iotwatch.application", *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, KafkaSettings]]:
    """A broker that authenticates with SCRAM and authorizes with ACLs, its topics and ACLs
    made by ``iotwatch provision topics --acls`` as admin: client settings per user."""
    passwords = {user: secrets.token_urlsafe(12) for user in (ADMIN_USER, *SERVICE_USERS)}
    broker = start_kafka_broker(tmp_path_factory.mktemp("secured"), 90, security=KafkaSecurity(passwords))
    try:
        users = {user: user_settings(broker.endpoint, user, password) for user, password in passwords.items()}
        provisioned = iotwatch(users[ADMIN_USER], "provision", "topics", "--acls", "--json")
        assert provisioned.returncode == 0, provisioned.stderr
        summary = json.loads(provisioned.stdout)
        assert summary["acls"] == len(service_grants(TopicSettings())) and len(summary["created"]) == 10
        # the broker applies new ACLs from its metadata log a moment after the controller took them
        wait_for(lambda: TopicSettings().raw in list_topics(users["gateway"]), 10, "the gateway's ACLs")
        yield users
    finally:
        stop_process(broker.process)


def test_each_service_user_can_do_its_job(
    secured: dict[str, KafkaSettings], stack_settings: Settings, unique: str
) -> None:
    topics = TopicSettings()
    gateway, stream = secured["gateway"], secured["stream"]
    # the gateway: its start-up check, then readings and dead letters
    assert ensure_topics(gateway, [topics.raw, topics.dlq]) == []
    producer = Producer({**client_config(gateway), "enable.idempotence": True})
    produce_confirmed(gateway, producer, topics.raw, b"dev-1", f"reading {unique}".encode())
    produce_confirmed(gateway, producer, topics.dlq, b"dev-1", b"not json")
    # the stream: reads the readings, writes alerts
    assert ensure_topics(stream, topics.kafka_topics()) == []
    follower = TopicFollower(stream, [topics.raw])
    try:
        assert f"reading {unique}".encode() in [m.value() for m in follower.catch_up(30)]
    finally:
        follower.close()
    hvac = make_alert(f"hvac-{unique}", "thermostat", "home-1", Rule.STUCK_HVAC, "major", "raised", 1_000)
    crash = make_alert(f"car-{unique}", "vehicle_edr", "fleet-1", Rule.CRASH, "critical", "raised", 2_000)
    producer = Producer({**client_config(stream), "enable.idempotence": True})
    for alert in (hvac, crash):
        produce_confirmed(stream, producer, topics.alerts, *alert_message(alert))

    # the responder, as it runs: reads alerts, writes a command's audit, an emergency record and
    # the twin a device reports (MQTT from the session's stack)
    policies = (
        CommandPolicy(name="reset", rule=Rule.STUCK_HVAC, device_type="thermostat", command="reset_hvac"),
        CommandPolicy(name="crash", rule=Rule.CRASH, device_type="vehicle_edr", action="emergency"),
    )
    settings = stack_settings.model_copy(
        update={
            "kafka": secured["responder"],
            "topics": topics,
            "respond": stack_settings.respond.model_copy(update={"client_id": f"responder-{unique}"}),
        }
    )
    admin = secured[ADMIN_USER]
    running = InThread(lambda stop: Responder(settings, policies, stop))

    def written(topic: str) -> bool:
        assert running.thread.is_alive(), "the responder stopped (its exception is in the warnings)"
        return bool(read_to_end(admin, topic, 10))

    try:
        wait_for(lambda: written(topics.commands), 30, "the responder's command audit")
        wait_for(lambda: written(topics.emergencies), 30, "the responder's emergency record")
        device = PersistentSession(stack_settings.mqtt, f"device-{unique}", [])
        device.connect()
        report = TwinReport(
            COMMAND_SCHEMA_VERSION, hvac.device_id, int(time.time() * 1000), TwinProperties(setpoint_c=20.0)
        )
        try:
            device.publish(twin_reported_topic(hvac.site, hvac.device_type, hvac.device_id), encode_report(report))
        finally:
            device.close()
        wait_for(lambda: written(topics.device_twin), 30, "the reported twin")
    finally:
        counts = running.close()
    audits = [decode_record(m.value(), CommandAudit) for m in read_to_end(admin, topics.commands)]
    assert {(a.device_id, a.name) for a in audits} == {(hvac.device_id, "reset_hvac")}
    emergencies = [decode_record(m.value(), Emergency) for m in read_to_end(admin, topics.emergencies)]
    assert [e.alert_id for e in emergencies] == [crash.alert_id]
    # the session's MQTT broker holds other tests' retained twin reports too: this device's is what counts
    reported = [decode_record(m.value(), TwinRecord) for m in read_to_end(admin, topics.device_twin)]
    assert [t.properties.setpoint_c for t in reported if t.device_id == hvac.device_id] == [20.0]
    assert counts.get("dead_lettered", 0) == 0


def test_what_a_user_may_not_do_is_refused_in_one_line(secured: dict[str, KafkaSettings]) -> None:
    topics = TopicSettings()
    # the gateway cannot read alerts: the on-call tail says so instead of waiting for a topic
    tail = iotwatch(secured["gateway"], "alerts", "tail", "--json", "--timeout", "20")
    assert tail.returncode == 1
    assert tail.stderr.splitlines() == [
        f"iotwatch: error: Kafka refused user 'gateway' READ on topic {topics.alerts} "
        "(not authorized; grant it with iotwatch provision topics --acls)"
    ]
    # the stream may see the alert topic (it writes it) but not read it: the fetch is refused
    tail = iotwatch(secured["stream"], "alerts", "tail", "--json", "--from-beginning", "--timeout", "20")
    said = [
        line for line in tail.stderr.splitlines() if " INFO iotwatch.alerts.tail: alerts tail: following " not in line
    ]
    assert (tail.returncode, said) == (  # what it follows (said on start), then the refusal
        1,
        [
            f"iotwatch: error: Kafka refused user 'stream' READ on topic {topics.alerts} "
            "(not authorized; grant it with iotwatch provision topics --acls)"
        ],
    )
    # the gateway cannot forge alerts either
    gateway = secured["gateway"]
    with pytest.raises(AccessRefused, match=f"^Kafka refused user 'gateway' WRITE on topic {topics.alerts} "):
        produce_confirmed(gateway, Producer(client_config(gateway)), topics.alerts, b"k", b"forged")
    # the responder cannot write raw telemetry
    responder = secured["responder"]
    with pytest.raises(AccessRefused, match=f"^Kafka refused user 'responder' WRITE on topic {topics.raw} "):
        produce_confirmed(responder, Producer(client_config(responder)), topics.raw, b"k", b"forged")
    # the stream may write dead letters, not read them back: a refused fetch, not an empty topic
    with pytest.raises(AccessRefused, match=f"^Kafka refused user 'stream' READ on topic {topics.dlq} "):
        read_to_end(secured["stream"], topics.dlq, 30)


@pytest.mark.parametrize("user", ["intruder", "gateway"])
def test_an_unknown_user_or_a_wrong_password_cannot_connect(secured: dict[str, KafkaSettings], user: str) -> None:
    kafka = secured["gateway"].model_copy(update={"sasl_username": user, "sasl_password": SecretStr("wrong")})
    listed = iotwatch(kafka, "alerts", "list", "--json")
    assert listed.returncode == 1
    assert listed.stderr.splitlines() == [
        f"iotwatch: error: Kafka at {kafka.bootstrap_servers} refused user {user!r}: SASL authentication failed "
        "(unknown user or wrong password; check IOTWATCH_KAFKA_SASL_USERNAME and IOTWATCH_KAFKA_SASL_PASSWORD)"
    ]
    assert listed.stdout == ""
