"""A private CA and the servers' certificates it signs, made with openssl: mosquitto's TLS listener and
the Kafka brokers' TLS listeners (docs/internals.md, "Certificates")."""

from __future__ import annotations

import ipaddress
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from iotwatch.errors import UserError

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SERVER_CERT = "server.crt"
SERVER_KEY = "server.key"
_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class TlsFiles:
    """Where the certificates and keys were written."""

    out_dir: Path
    hosts: tuple[str, ...]
    days: int

    def summary(self) -> dict[str, object]:
        return {
            "out_dir": str(self.out_dir),
            "hosts": list(self.hosts),
            "days": self.days,
            **{name.replace(".", "_"): str(self.out_dir / name) for name in (CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY)},
        }


@dataclass(frozen=True)
class KafkaKeystore:
    """One Kafka broker's PKCS12 keystore (key and certificate chain), its password file and
    the CA certificate its clients trust."""

    broker: str
    hosts: tuple[str, ...]
    keystore: Path
    password_file: Path
    ca_file: Path

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    def summary(self) -> dict[str, object]:
        return {
            "broker": self.broker,
            "hosts": list(self.hosts),
            "keystore": str(self.keystore),
            "keystore_password_file": str(self.password_file),
            "ca_file": str(self.ca_file),
        }


def subject_alt_names(hosts: list[str]) -> str:
    """``DNS:name,IP:addr,...`` for the server certificate."""
    if not hosts:
        raise UserError("give at least one --host the server is reached by (e.g. mosquitto, localhost)")
    names = []
    for host in hosts:
        try:
            names.append(f"IP:{ipaddress.ip_address(host)}")
        except ValueError:
            if not host or any(c in host for c in " ,/:=") or host.startswith("-"):
                raise UserError(f"--host {host!r} is neither a host name nor an IP address") from None
            names.append(f"DNS:{host}")
    return ",".join(names)


def make_certificates(out_dir: Path, hosts: list[str], days: int = 825, *, new_ca: bool = False) -> TlsFiles:
    """Create (or reuse) the CA in ``out_dir`` and issue a fresh server certificate for ``hosts``
    (mosquitto's ``server.crt`` and ``server.key``).

    An existing CA is kept unless ``new_ca``, so devices that trust it keep working when the
    server certificate is renewed.
    """
    ensure_ca(out_dir, days, new_ca=new_ca)
    issue_certificate(out_dir, out_dir / SERVER_CERT, out_dir / SERVER_KEY, hosts, days)
    return TlsFiles(out_dir, tuple(hosts), days)


def make_kafka_keystore(out_dir: Path, ca_dir: Path, broker: str, hosts: list[str], days: int = 825) -> KafkaKeystore:
    """Issue ``broker``'s certificate for ``hosts`` from the CA in ``ca_dir`` (made there if
    missing) and pack it with its key into ``out_dir/<broker>.p12``; ``ca.crt`` is copied
    beside it for the broker's own clients (inter-broker, MirrorMaker). A renewal keeps the
    keystore's password, so the broker's configuration does not change."""
    if not broker or not broker.replace("-", "").replace("_", "").isalnum():
        raise UserError(f"Kafka broker name {broker!r}: letters, digits, '-' and '_' only")
    ensure_ca(ca_dir, days)
    out_dir.mkdir(parents=True, exist_ok=True)
    cert, key = out_dir / f"{broker}.crt", out_dir / f"{broker}.key"
    issue_certificate(ca_dir, cert, key, hosts, days)
    ca_file = out_dir / CA_CERT
    if ca_file.resolve() != (ca_dir / CA_CERT).resolve():
        shutil.copyfile(ca_dir / CA_CERT, ca_file)
    password_file = out_dir / f"{broker}.p12.password"
    if not password_file.exists():
        password_file.write_text(secrets.token_urlsafe(24) + "\n")
        password_file.chmod(0o600)
    keystore = out_dir / f"{broker}.p12"
    _run(
        _openssl(),
        "pkcs12",
        "-export",
        "-name",
        broker,
        "-in",
        cert,
        "-inkey",
        key,
        "-certfile",
        ca_dir / CA_CERT,
        "-out",
        keystore,
        "-passout",
        f"file:{password_file}",
    )
    keystore.chmod(0o600)
    return KafkaKeystore(broker, tuple(hosts), keystore, password_file, ca_file)


def ensure_ca(ca_dir: Path, days: int, *, new_ca: bool = False) -> Path:
    """The CA certificate in ``ca_dir``, made (key and certificate) if missing or ``new_ca``."""
    if days < 1:
        raise UserError("--days must be at least 1")
    ca_dir.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = ca_dir / CA_CERT, ca_dir / CA_KEY
    if new_ca or not (ca_cert.exists() and ca_key.exists()):
        _run(
            _openssl(),
            "req",
            "-x509",
            *_EC_KEY,
            "-keyout",
            ca_key,
            "-out",
            ca_cert,
            "-days",
            str(days),
            "-subj",
            "/CN=iotwatch private CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE,pathlen:0",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        )
        ca_key.chmod(0o600)
    return ca_cert


def issue_certificate(ca_dir: Path, cert: Path, key: Path, hosts: list[str], days: int) -> None:
    """A new key and a server certificate for ``hosts`` signed by the CA in ``ca_dir``."""
    if days < 1:
        raise UserError("--days must be at least 1")
    san = subject_alt_names(hosts)
    openssl = _openssl()
    csr, extensions = cert.with_suffix(".csr"), cert.with_suffix(".ext")
    _run(openssl, "req", "-new", *_EC_KEY, "-keyout", key, "-out", csr, "-subj", f"/CN={hosts[0]}")
    extensions.write_text(
        f"basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={san}\n"
    )
    try:
        _run(
            openssl,
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca_dir / CA_CERT,
            "-CAkey",
            ca_dir / CA_KEY,
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            str(days),
            "-sha256",
            "-extfile",
            extensions,
        )
    finally:
        csr.unlink(missing_ok=True)
        extensions.unlink(missing_ok=True)
    key.chmod(0o600)


def _openssl() -> str:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise UserError("openssl is not installed (apt-get install -y openssl)")
    return openssl


def _run(*command: str | Path) -> None:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"openssl {command[1]} failed: {last}")
