"""Why a TLS connection to a server was refused, in one line an operator can act on (docs/internals.md,
"TLS probe")."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

#: OpenSSL's verify results for a certificate that does not name the host (or IP) connected to.
NAME_MISMATCH = {62, 64}


def certificate_problem(host: str, port: int, ca_file: Path | None, timeout_s: float = 5.0) -> str | None:
    """What is wrong with the certificate ``host:port`` presents, verified with ``ca_file``
    (the system's CAs if None) for the name ``host``: None when it verifies (or the server
    could not be reached)."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        if exc.verify_code in NAME_MISMATCH:
            return f"its certificate does not name {host!r} ({exc.verify_message})"
        trusted = f"the CA in {ca_file}" if ca_file else "the system's CAs"
        return f"its certificate is not signed by {trusted} ({exc.verify_message})"
    except (OSError, ssl.SSLError):
        return None


def speaks_tls(host: str, port: int, timeout_s: float = 5.0) -> bool:
    """Whether ``host:port`` completes a TLS handshake (its certificate not checked)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except (OSError, ssl.SSLError):
        return False
