"""A private CA and a server certificate for mosquitto's TLS listener, made with openssl.

Devices trust ``ca.crt`` (IOTWATCH_MQTT_TLS_CA_FILE) and connect to ``mqtts://HOST:8883``;
the server certificate names every host given (subjectAltName: DNS names and IP
addresses), which is what clients verify. The CA key stays in the output folder: keep it
offline after provisioning, it is only needed to issue the next server certificate.
openssl is used rather than a Python crypto package because it is on every machine that
runs mosquitto and the project does not otherwise depend on one.
"""

from __future__ import annotations

import ipaddress
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


def subject_alt_names(hosts: list[str]) -> str:
    """``DNS:name,IP:addr,...`` for the server certificate."""
    if not hosts:
        raise UserError("give at least one --host the broker is reached by (e.g. mosquitto, localhost)")
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
    """Create (or reuse) the CA in ``out_dir`` and issue a fresh server certificate for ``hosts``.

    An existing CA is kept unless ``new_ca``, so devices that trust it keep working when the
    server certificate is renewed.
    """
    if days < 1:
        raise UserError("--days must be at least 1")
    san = subject_alt_names(hosts)
    openssl = shutil.which("openssl")
    if openssl is None:
        raise UserError("openssl is not installed (apt-get install -y openssl)")
    out_dir.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = out_dir / CA_CERT, out_dir / CA_KEY
    if new_ca or not (ca_cert.exists() and ca_key.exists()):
        _run(
            openssl,
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
            "/CN=iotwatch MQTT CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE,pathlen:0",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        )
    csr, extensions = out_dir / "server.csr", out_dir / "server.ext"
    _run(openssl, "req", "-new", *_EC_KEY, "-keyout", out_dir / SERVER_KEY, "-out", csr, "-subj", f"/CN={hosts[0]}")
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
            ca_cert,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            out_dir / SERVER_CERT,
            "-days",
            str(days),
            "-sha256",
            "-extfile",
            extensions,
        )
    finally:
        csr.unlink(missing_ok=True)
        extensions.unlink(missing_ok=True)
    for key in (ca_key, out_dir / SERVER_KEY):
        key.chmod(0o600)
    return TlsFiles(out_dir, tuple(hosts), days)


def _run(*command: str | Path) -> None:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"openssl {command[1]} failed: {last}")
