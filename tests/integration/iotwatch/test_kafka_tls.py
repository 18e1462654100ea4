"""Kafka over TLS on a real Apache Kafka broker, with the keystore ``iotwatch provision tls``
makes and the users and ACLs compose gives its services (``SASL_SSL``, as on compose's EXTERNAL
listener):

- the gateway, Spark's Kafka connector (the job's reader) and ``iotwatch alerts tail`` work
  over it, each verifying the broker's certificate with the provisioned CA;
- a client trusting another CA, one that reaches the broker by a name its certificate does
  not hold, and a plaintext client are each refused in one line that says which.

One broker for the module: its start and the provisioning cost a few seconds, not each test.
"""

from __future__ import annotations

import json
import logging
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from pydantic import SecretStr

from iotwatch.application.cli import cli
from iotwatch.application.stack.kafka_broker import ADMIN_USER, SCRAM_MECHANISM, KafkaSecurity, start_kafka_broker
from iotwatch.application.stack.process import stop_process
from iotwatch.certificates import KafkaKeystore
from iotwatch.clients.kafka import client_config, list_topics, produce_confirmed
from iotwatch.contract.alerts import alert_message, decode_alert
from iotwatch.contract.detection import Rule
from iotwatch.errors import TlsRefused
from iotwatch.gateway.bridge import Gateway
from iotwatch.settings import KafkaSettings, Settings, TopicSettings
from iotwatch.streaming.kafka_source import read_kafka_stream
from tests.helpers import Publisher, read_topic, seqs_by_device, user_env, wait_for
from tests.support.alerts import make_alert
from tests.support.gateway import gateway_settings

USERS = (ADMIN_USER, "gateway", "stream", "responder")


def iotwatch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The real command line, configured by the environment as compose configures it."""
    command = [sys.executable, "-m", "iotwatch.application", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env={**user_env(), **env})


def provision(folder: Path, *hosts: str) -> KafkaKeystore:
    """``iotwatch provision tls`` as an operator runs it: a CA and the broker ``kafka``'s keystore."""
    made = iotwatch(
        {},
        "provision",
        "tls",
        "--out",
        str(folder),
        "--kafka-out",
        str(folder / "kafka"),
        "--kafka",
        f"kafka={','.join(hosts)}",
        "--json",
    )
    assert made.returncode == 0, made.stderr
    keystore = json.loads(made.stdout)["kafka"][0]
    assert keystore["hosts"] == list(hosts)
    return KafkaKeystore(
        "kafka",
        tuple(hosts),
        Path(keystore["keystore"]),
        Path(keystore["keystore_password_file"]),
        Path(keystore["ca_file"]),
    )


def user_settings(endpoint: str, ca_file: Path, user: str, password: str) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=endpoint,
        security_protocol="SASL_SSL",
        ssl_ca_location=ca_file,
        sasl_mechanism=SCRAM_MECHANISM,
        sasl_username=user,
        sasl_password=SecretStr(password),
    )


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, KafkaSettings]]:
    """A broker whose one listener is SASL_SSL, its certificate naming 127.0.0.1 only (the
    address it advertises), its topics and ACLs made by ``iotwatch provision topics --acls``
    over TLS as admin: client settings per user."""
    folder = tmp_path_factory.mktemp("kafka-tls")
    keystore = provision(folder / "tls", "127.0.0.1")
    passwords = {user: secrets.token_urlsafe(12) for user in USERS}
    broker = start_kafka_broker(folder, 90, security=KafkaSecurity(passwords, tls=keystore))
    try:
        users = {user: user_settings(broker.endpoint, keystore.ca_file, user, pw) for user, pw in passwords.items()}
        provisioned = iotwatch(users[ADMIN_USER].as_environment(), "provision", "topics", "--acls", "--json")
        assert provisioned.returncode == 0, provisioned.stderr
        wait_for(lambda: TopicSettings().raw in list_topics(users["gateway"]), 10, "the gateway's ACLs")
        yield users
    finally:
        stop_process(broker.process)


@pytest.mark.slow  # Spark's session
def test_gateway_spark_connector_and_alerts_tail_work_over_sasl_ssl(
    tls_broker: dict[str, KafkaSettings], stack_settings: Settings, spark: Any, unique: str
) -> None:
    topics = TopicSettings()
    # the gateway: readings from the session's MQTT broker into the TLS broker
    settings = gateway_settings(stack_settings, unique).model_copy(
        update={"kafka": tls_broker["gateway"], "topics": topics}
    )
    bridge = Gateway(settings)
    bridge.start()
    devices = [f"tls-{unique}-{i}" for i in range(3)]
    try:
        Publisher(stack_settings.mqtt, devices, count=20).start().join()
        wait_for(lambda: bridge.report()["forwarded"] >= 60, 30, "the gateway's 60 readings confirmed")
    finally:
        bridge.stop()
    mine = [m for m in read_topic(tls_broker[ADMIN_USER], topics.raw, timeout_s=10, idle_s=1.0) if m.key()]
    assert {d: s for d, s in seqs_by_device(mine).items() if d in devices} == {d: list(range(20)) for d in devices}

    # Spark's Kafka connector, as the job reads: the JVM client over SASL_SSL with a PEM truststore
    frame = read_kafka_stream(spark, tls_broker["stream"], [topics.raw])
    query = frame.writeStream.format("memory").queryName(f"tls_{unique}").trigger(availableNow=True).start()
    try:
        query.awaitTermination(120)
        assert query.exception() is None
        keys = [row.key.decode() for row in spark.sql(f"select key from tls_{unique}").collect()]  # type: ignore[attr-defined]
    finally:
        query.stop()
    assert sorted(key for key in keys if key in devices) == sorted(devices * 20)

    # alerts tail, as the responder's user (the one that reads alerts)
    stream = tls_broker["stream"]
    alert = make_alert(f"tls-{unique}", "thermostat", "home-1", Rule.STUCK_HVAC, "major", "raised", 1_000)
    produce_confirmed(stream, Producer(client_config(stream)), topics.alerts, *alert_message(alert))
    env = {**tls_broker["responder"].as_environment(), "IOTWATCH_ALERTS_SESSION_TIMEOUT_MS": "6000"}
    tail = CliRunner().invoke(
        cli, ["alerts", "tail", "--from-beginning", "--json", "--limit", "1", "--timeout", "40"], env=env
    )
    assert tail.exit_code == 0, tail.output
    shown = [decode_alert(line.encode()) for line in tail.output.splitlines() if line.startswith("{")]
    assert shown == [alert]


def refusal(settings: KafkaSettings) -> str:
    """The one line a client is refused with, and how long it took."""
    started = time.monotonic()
    with pytest.raises(TlsRefused) as refused:
        list_topics(settings, timeout_s=10)
    assert time.monotonic() - started < 15
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_another_ca_a_name_not_in_the_certificate_and_plaintext_are_refused_in_one_line(
    tls_broker: dict[str, KafkaSettings],
    stack_settings: Settings,
    unique: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway = tls_broker["gateway"]
    port = gateway.bootstrap_servers.rsplit(":", 1)[1]
    stranger = provision(tmp_path / "stranger", "127.0.0.1")

    line = refusal(gateway.model_copy(update={"ssl_ca_location": stranger.ca_file}))
    assert f"its certificate is not signed by the CA in {stranger.ca_file}" in line

    line = refusal(gateway.model_copy(update={"bootstrap_servers": f"localhost:{port}"}))
    assert "its certificate does not name 'localhost'" in line

    line = refusal(gateway.model_copy(update={"security_protocol": "SASL_PLAINTEXT"}))
    assert "speaks TLS and this client SASL_PLAINTEXT" in line

    # a running gateway whose broker's certificate it cannot verify says why it is down
    untrusting = gateway.model_copy(update={"ssl_ca_location": stranger.ca_file})
    settings = gateway_settings(stack_settings, unique, kafka_check_interval_s=1.0).model_copy(
        update={"kafka": untrusting}
    )
    bridge = Gateway(settings)
    with caplog.at_level(logging.ERROR, logger="iotwatch.gateway.bridge"):
        bridge.start()
        try:
            wait_for(lambda: "not signed by the CA" in caplog.text, 15, "the gateway's reason")
        finally:
            bridge.stop(drain=False)

    # the command line says the same in one line on stderr, exit status 1
    env = gateway.model_copy(update={"ssl_ca_location": stranger.ca_file}).as_environment()
    result = iotwatch(env, "provision", "topics")
    assert result.returncode == 1 and "not signed by the CA" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
