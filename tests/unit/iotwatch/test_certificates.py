"""The private CA and the servers' certificates: names, renewal that keeps the CA, and a Kafka
keystore openssl opens with its password (what the broker reads)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from iotwatch.certificates import make_certificates, make_kafka_keystore, subject_alt_names
from iotwatch.errors import UserError


def _text(cert: Path) -> str:
    return subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-text"], capture_output=True, text=True, check=True
    ).stdout


def _verifies(ca: Path, cert: Path) -> bool:
    return subprocess.run(["openssl", "verify", "-CAfile", str(ca), str(cert)], capture_output=True).returncode == 0


def test_subject_alt_names_tell_addresses_from_names() -> None:
    assert subject_alt_names(["kafka", "127.0.0.1", "::1"]) == "DNS:kafka,IP:127.0.0.1,IP:::1"
    with pytest.raises(UserError):
        subject_alt_names(["bad,name"])
    with pytest.raises(UserError):
        subject_alt_names([])


def test_kafka_keystore_is_signed_by_the_mqtt_ca_names_its_hosts_and_renewal_keeps_ca_and_password(
    tmp_path: Path,
) -> None:
    ca_dir, kafka_dir = tmp_path / "mosquitto", tmp_path / "kafka"
    make_certificates(ca_dir, ["mosquitto"])
    keystore = make_kafka_keystore(kafka_dir, ca_dir, "kafka", ["kafka", "localhost", "127.0.0.1"])
    cert = kafka_dir / "kafka.crt"
    assert _verifies(ca_dir / "ca.crt", cert)
    assert "DNS:kafka, DNS:localhost, IP Address:127.0.0.1" in _text(cert)
    assert keystore.ca_file.read_bytes() == (ca_dir / "ca.crt").read_bytes()
    assert (
        oct(keystore.keystore.stat().st_mode & 0o777) == oct(keystore.password_file.stat().st_mode & 0o777) == "0o600"
    )
    # the PKCS12 opens with its password and holds the key and the chain up to the CA
    opened = subprocess.run(
        ["openssl", "pkcs12", "-in", str(keystore.keystore), "-passin", f"pass:{keystore.password}", "-nodes"],
        capture_output=True,
        text=True,
    )
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout.count("BEGIN CERTIFICATE") == 2 and "PRIVATE KEY" in opened.stdout

    ca_before, password_before, serial_before = (ca_dir / "ca.crt").read_bytes(), keystore.password, _text(cert)
    renewed = make_kafka_keystore(kafka_dir, ca_dir, "kafka", ["kafka"])
    assert (ca_dir / "ca.crt").read_bytes() == ca_before and renewed.password == password_before
    assert _text(cert) != serial_before and _verifies(ca_dir / "ca.crt", cert)


def test_a_broker_name_is_a_file_name() -> None:
    with pytest.raises(UserError):
        make_kafka_keystore(Path("/nonexistent"), Path("/nonexistent"), "../kafka", ["kafka"])
