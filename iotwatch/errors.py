"""Errors the command line reports as one line on stderr (exit status 1).

Anything else that reaches the command line is a bug: it is reported as an internal error,
with its traceback under ``--log-level debug``.
"""

import re


class IotwatchError(Exception):
    """An expected failure with a message that says what to do about it."""


class UserError(IotwatchError, ValueError):
    """A mistake in what the user asked for: an option, a setting, a parameter, a file.

    A ``ValueError`` too, so that validators (pydantic's, click's) report it as invalid input.
    """


class StackError(IotwatchError):
    """The embedded stack could not start, or a prerequisite is missing."""


class MissingArtifacts(StackError):
    """Java artifacts that ``iotwatch setup`` installs are not there (retrying cannot help)."""


class ServiceUnavailable(IotwatchError):
    """A service (MQTT, Kafka, InfluxDB) did not answer."""


class AccessRefused(IotwatchError):
    """A server refused the configured user: unknown user or wrong password, or no ACL
    for the operation (the message names the user, the resource and the operation)."""


class TlsRefused(ServiceUnavailable):
    """A TLS connection failed its handshake: a certificate the client does not trust, one
    for another name, or one side speaking TLS and the other not (the message says which)."""


def connection_failure(exc: BaseException) -> str:
    """The operating system's words for why a connection failed (``connection refused``,
    ``name or service not known``, ``timed out``), not the HTTP library's nested repr."""
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if found:
        return found.group(1).strip().lower()
    if "NameResolutionError" in text or "Failed to resolve" in text:
        host = re.search(r"Failed to resolve '([^']+)'", text)
        return f"cannot resolve {host.group(1)}" if host else "cannot resolve the host"
    if "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
        return "timed out"
    return type(exc).__name__
