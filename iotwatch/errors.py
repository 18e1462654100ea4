"""Errors the command line reports as one line on stderr (exit status 1).

Anything else that reaches the command line is a bug: it is reported as an internal error,
with its traceback under ``--log-level debug``.
"""


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
