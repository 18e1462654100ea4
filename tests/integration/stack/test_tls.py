"""``iotwatch stack up --tls``: every Kafka node of the embedded stack, a site's included, speaks
TLS with a certificate from the stack's private CA; the site's MirrorMaker 2 replicates over it;
a third-party client verifies the certificate with the ``ca_file`` the JSON names; a plaintext
client is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from iotwatch.application.stack.mirror_maker import remote_topic
from iotwatch.clients.kafka import list_topics, read_to_end
from iotwatch.errors import TlsRefused
from iotwatch.settings import KafkaSettings, TopicSettings
from tests.helpers import user_env, wait_for


def iotwatch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iotwatch.application", *args], capture_output=True, text=True, env=env, timeout=300
    )


#: a whole stack with a site and its MirrorMaker (about 90 s)
pytestmark = pytest.mark.slow


def test_stack_up_tls_with_a_site_replicates_over_tls_and_refuses_plaintext(tmp_path: Path, unique: str) -> None:
    run_dir = tmp_path / "run"
    env = user_env()
    up = iotwatch(env, "stack", "up", "--tls", "--sites", "1", "--no-influx", "--run-dir", str(run_dir), "--json")
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    try:
        ca_file = Path(state["ca_file"])
        assert ca_file == run_dir / "tls" / "ca.crt" and ca_file.is_file()
        variables = state["sites"]["site1"]["env"]
        assert variables["IOTWATCH_KAFKA_SECURITY_PROTOCOL"] == "SSL"
        assert variables["IOTWATCH_KAFKA_SSL_CA_LOCATION"] == str(ca_file)
        central, site = state["endpoints"]["kafka"], state["sites"]["site1"]["kafka"]

        # a site's gateway, configured by the variables printed, writes at its site over TLS ...
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=site, security_protocol="SSL", ssl_cafile=str(ca_file))
        producer.send(TopicSettings().raw, key=b"d1", value=f"over tls {unique}".encode()).get(timeout=30)
        producer.close()
        # ... and the site's MirrorMaker copies it to the centre over TLS
        at_centre = KafkaSettings(bootstrap_servers=central, security_protocol="SSL", ssl_ca_location=ca_file)
        replica = remote_topic("site1", TopicSettings().raw)
        wait_for(
            lambda: f"over tls {unique}".encode() in [m.value() for m in read_to_end(at_centre, replica, 10)],
            90,
            "the reading replicated to the centre",
        )
        with pytest.raises(TlsRefused, match="speaks TLS and this client PLAINTEXT"):
            list_topics(KafkaSettings(bootstrap_servers=central), timeout_s=5)
        status = iotwatch(env, "stack", "status", "--run-dir", str(run_dir), "--json")
        assert status.returncode == 0 and json.loads(status.stdout)["up"] is True, status.stdout
    finally:
        down = iotwatch(env, "stack", "down", "--run-dir", str(run_dir))
    assert down.returncode == 0, down.stderr
