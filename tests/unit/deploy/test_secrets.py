"""Placeholder secrets are refused where the deployment starts: the iotwatch services (with
IOTWATCH_DEPLOYMENT_REQUIRE_SECRETS, which docker-compose.yml sets) and the mosquitto entry
point. The commands run for real, as compose runs them; each refusal is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from iotwatch.settings import load_settings
from tests.conftest import REPO_ROOT
from tests.helpers import user_env

REPO = REPO_ROOT
PLACEHOLDER = "CHANGE_ME-mqtt-service-password"


def clean_env(**values: str) -> dict[str, str]:
    """This process's environment without IOTWATCH_* settings, plus ``values``."""
    env = user_env()
    return {**env, **values}


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize(
    "command, variable, value",
    [
        (["gateway"], "IOTWATCH_MQTT_PASSWORD", PLACEHOLDER),
        (["stream"], "IOTWATCH_INFLUX_TOKEN", "CHANGE_ME-influxdb-token"),
        (["provision", "topics"], "IOTWATCH_KAFKA_SASL_PASSWORD", "change-me"),
    ],
)
def test_services_refuse_placeholder_secrets(command: list[str], variable: str, value: str) -> None:
    # Endpoints nobody listens on: were the secret accepted, the service would try them
    # and fail differently (or hang), not with this message.
    env = clean_env(
        IOTWATCH_DEPLOYMENT_REQUIRE_SECRETS="true",
        IOTWATCH_MQTT_URL="mqtt://127.0.0.1:9",
        IOTWATCH_MQTT_USERNAME="iotwatch",
        IOTWATCH_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:9",
        IOTWATCH_KAFKA_SASL_USERNAME="gateway",
        IOTWATCH_INFLUX_URL="http://127.0.0.1:9",
        IOTWATCH_MQTT_PASSWORD="real-secret",
        IOTWATCH_KAFKA_SASL_PASSWORD="real-secret",
    )
    env[variable] = value
    result = run([sys.executable, "-m", "iotwatch.application", *command], env)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("iotwatch: error: refusing to start with unusable secrets")
    assert f"{variable} is a placeholder" in lines[0]
    assert value not in lines[0], "the error repeats the secret"


def test_a_user_name_without_its_password_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [key for key in os.environ if key.startswith("IOTWATCH_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("IOTWATCH_DEPLOYMENT_REQUIRE_SECRETS", "true")
    monkeypatch.setenv("IOTWATCH_KAFKA_SASL_USERNAME", "stream")
    with pytest.raises(ValueError, match="IOTWATCH_KAFKA_SASL_PASSWORD is not set"):
        load_settings()
    monkeypatch.setenv("IOTWATCH_KAFKA_SASL_PASSWORD", "a-real-one")
    assert load_settings().kafka.sasl_password is not None


def test_placeholders_pass_when_not_required(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside compose (the embedded stack, tests) nothing is required."""
    for key in [key for key in os.environ if key.startswith("IOTWATCH_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("IOTWATCH_MQTT_PASSWORD", PLACEHOLDER)
    assert not load_settings().deployment.require_secrets


def test_mosquitto_entrypoint_refuses_placeholder_passwords(tmp_path: Path) -> None:
    env = clean_env(
        MQTT_AUTH_DIR=str(tmp_path / "auth"),
        MQTT_TLS_DIR=str(tmp_path / "tls"),
        MQTT_FLEET_DIR=str(tmp_path / "fleet"),
        MQTT_USERNAME="iotwatch",
        MQTT_PASSWORD=PLACEHOLDER,
        MQTT_RESPONDER_USERNAME="responder",
        MQTT_RESPONDER_PASSWORD="real-responder-secret",
        MQTT_DEVICE_USERNAME="device",
        MQTT_DEVICE_PASSWORD="real-device-secret",
    )
    result = run(["sh", str(REPO / "deploy/mosquitto/entrypoint.sh"), "true"], env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "mosquitto entrypoint: an MQTT_*_PASSWORD is still the .env.example placeholder; set real values in .env"
    ]
    assert not (tmp_path / "auth").exists(), "files were written before the check"


@pytest.mark.parametrize(
    "script, env, message",
    [
        (
            "deploy/kafka/entrypoint.sh",
            {
                "SCRAM_ADMIN_PASSWORD": "real-admin-secret",
                "SCRAM_GATEWAY_PASSWORD": "CHANGE_ME-kafka-gateway-password",
                "SCRAM_STREAM_PASSWORD": "real-stream-secret",
                "SCRAM_RESPONDER_PASSWORD": "real-responder-secret",
                "SCRAM_MIRROR_PASSWORD": "real-mirror-secret",
            },
            "kafka entrypoint: a KAFKA_*_PASSWORD is still the .env.example placeholder; set real values in .env",
        ),
        (
            "deploy/influxdb/initdb/20-iotwatch-auth.sh",
            {
                "DOCKER_INFLUXDB_INIT_ORG": "iotwatch",
                "DOCKER_INFLUXDB_INIT_BUCKET_ID": "0123456789abcdef",
                "INFLUX_WRITER_USER": "iotwatch",
                "INFLUX_WRITER_PASSWORD": "real-writer-secret",
                "INFLUX_READER_USER": "grafana",
                "INFLUX_READER_PASSWORD": "CHANGE_ME-influxdb-reader-password",
            },
            "iotwatch: an INFLUXDB_*_PASSWORD is still the .env.example placeholder; set real values in .env",
        ),
    ],
)
def test_kafka_and_influxdb_scripts_refuse_placeholder_passwords(
    script: str, env: dict[str, str], message: str
) -> None:
    """They stop before running anything (the Kafka and InfluxDB tools are not on this machine:
    reaching them would be a different failure)."""
    shell = "bash" if script.endswith("auth.sh") else "sh"
    result = run([shell, str(REPO / script), "true"], clean_env(**env))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [message]
