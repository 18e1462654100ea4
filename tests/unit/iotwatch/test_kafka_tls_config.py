"""One Kafka connection, spelt for each client: librdkafka's CA file, the Java client's PEM
truststore (Spark's connector, MirrorMaker 2), the embedded stack's variables; and the one
line a refused TLS handshake is reported in."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from pydantic import SecretStr

from iotwatch.application.stack.embedded import StackState
from iotwatch.application.stack.kafka_broker import admin_settings
from iotwatch.application.stack.mirror_maker import CENTRAL, ClusterLink
from iotwatch.clients.kafka import java_client_properties, tls_refused
from iotwatch.settings import BACKOFF_MAX_MS, KafkaSettings, load_settings
from iotwatch.streaming.kafka_source import kafka_options

SASL_SSL = KafkaSettings(
    bootstrap_servers="kafka.example.net:9094",
    security_protocol="SASL_SSL",
    ssl_ca_location=Path("/etc/iotwatch/ca.crt"),
    sasl_mechanism="SCRAM-SHA-512",
    sasl_username="stream",
    sasl_password=SecretStr("secret"),
)


def test_every_client_gets_the_protocol_and_the_ca() -> None:
    assert SASL_SSL.client_config()["ssl.ca.location"] == "/etc/iotwatch/ca.crt"
    java = java_client_properties(SASL_SSL)
    assert (java["security.protocol"], java["ssl.truststore.type"], java["ssl.truststore.location"]) == (
        "SASL_SSL",
        "PEM",
        "/etc/iotwatch/ca.crt",
    )
    assert 'username="stream" password="secret"' in java["sasl.jaas.config"]
    # a broker back from a restart is tried within the same back-off by librdkafka and Java clients
    assert BACKOFF_MAX_MS.items() <= SASL_SSL.client_config().items() and BACKOFF_MAX_MS.items() <= java.items()
    # Spark's connector: the same properties, prefixed
    assert {f"kafka.{k}": v for k, v in java.items()}.items() <= kafka_options(SASL_SSL).items()
    # MirrorMaker: the same, without the bootstrap servers it sets itself; none for a plaintext cluster
    link = ClusterLink.of(CENTRAL, SASL_SSL)
    assert link.bootstrap_servers == "kafka.example.net:9094" and link.client is not None
    assert "bootstrap.servers" not in link.client and link.client["ssl.truststore.type"] == "PEM"
    assert ClusterLink.of(CENTRAL, KafkaSettings(bootstrap_servers="127.0.0.1:9092")).client is None


def test_a_tls_stack_points_its_clients_at_its_ca(tmp_path: Path) -> None:
    state = StackState(tmp_path, ca_file=str(tmp_path / "tls" / "ca.crt"))
    kafka = state.apply_to(load_settings()).kafka
    assert (kafka.security_protocol, kafka.ssl_ca_location) == ("SSL", tmp_path / "tls" / "ca.crt")
    assert state.env()["IOTWATCH_KAFKA_SECURITY_PROTOCOL"] == "SSL"
    assert state.env()["IOTWATCH_KAFKA_SSL_CA_LOCATION"] == str(tmp_path / "tls" / "ca.crt")
    assert state.to_dict()["ca_file"] == str(tmp_path / "tls" / "ca.crt")
    state.save()
    loaded = StackState.load(tmp_path)
    assert loaded is not None and loaded.ca_file == state.ca_file
    assert StackState(tmp_path).env().get("IOTWATCH_KAFKA_SECURITY_PROTOCOL") is None


def test_a_tls_client_of_a_plaintext_listener_is_told_so_in_one_line() -> None:
    failure = KafkaError(
        KafkaError._SSL,
        "ssl://127.0.0.1:9094/bootstrap: SSL handshake failed: Disconnected: SSL connection closed by peer: "
        "connecting to a PLAINTEXT broker listener? (after 1ms in state SSL_HANDSHAKE)",
    )
    refused = tls_refused(SASL_SSL, [failure])
    assert refused is not None and "does not speak TLS on this port" in str(refused) and "\n" not in str(refused)
    assert tls_refused(SASL_SSL, [KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")]) is None


def test_the_stack_s_own_clients_ignore_the_caller_s_kafka_security(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell pointed at a TLS cluster can still start and use a plaintext stack, and back."""
    monkeypatch.setenv("IOTWATCH_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("IOTWATCH_KAFKA_SASL_USERNAME", "gateway")
    plain = StackState(tmp_path).kafka_client("127.0.0.1:9092")
    assert (plain.security_protocol, plain.sasl_username, plain.ssl_ca_location) == ("PLAINTEXT", None, None)
    assert admin_settings("127.0.0.1:9092").security_protocol == "PLAINTEXT"
    assert StackState(tmp_path).apply_to(load_settings()).kafka.security_protocol == "PLAINTEXT"
    tls = StackState(tmp_path, ca_file="/run/tls/ca.crt").kafka_client("127.0.0.1:9092")
    assert (tls.security_protocol, tls.sasl_username) == ("SSL", None)
