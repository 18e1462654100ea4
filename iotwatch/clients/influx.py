"""InfluxDB through its v1-compatible HTTP API: ``/ping``, ``/write`` and ``/query``
(docs/internals.md, "InfluxDB client")."""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import requests
from influxdb_client import Point

from iotwatch.errors import ServiceUnavailable, connection_failure
from iotwatch.settings import InfluxSettings


class InfluxV1Client:
    """Writes line protocol and runs InfluxQL against one database."""

    def __init__(self, settings: InfluxSettings, timeout_s: float = 10.0) -> None:
        if not settings.url:
            raise ServiceUnavailable("InfluxDB is disabled (IOTWATCH_INFLUX_URL is empty)")
        self.settings = settings
        self.base_url = settings.url.rstrip("/")
        self.timeout_s = timeout_s
        self.session = requests.Session()
        if settings.token:
            self.session.headers["Authorization"] = f"Token {settings.token.get_secret_value()}"
        elif settings.username:
            password = settings.password.get_secret_value() if settings.password else ""
            self.session.auth = (settings.username, password)

    def close(self) -> None:
        self.session.close()

    def ping(self) -> str:
        """The server's version, or :class:`ServiceUnavailable`."""
        try:
            response = self.session.get(f"{self.base_url}/ping", timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise ServiceUnavailable(f"InfluxDB at {self.base_url} did not answer: {exc}") from exc
        if response.status_code != 204:
            raise ServiceUnavailable(f"InfluxDB at {self.base_url} /ping answered {response.status_code}")
        return response.headers.get("X-Influxdb-Version", "unknown")

    def create_database(self) -> None:
        self.query(f'CREATE DATABASE "{self.settings.database}"', method="POST")

    def write_points(self, points: Iterable[Point], precision: str = "ms") -> int:
        lines = [point.to_line_protocol() for point in points]
        lines = [line for line in lines if line]
        if lines:
            self.write_lines(lines, precision)
        return len(lines)

    def write_lines(self, lines: list[str], precision: str = "ms") -> None:
        params = {"db": self.settings.database, "precision": precision}
        if self.settings.retention_policy:
            params["rp"] = self.settings.retention_policy
        try:
            response = self.session.post(
                f"{self.base_url}/write", params=params, data="\n".join(lines).encode(), timeout=self.timeout_s
            )
        except requests.RequestException as exc:
            raise ServiceUnavailable(f"InfluxDB write to {self.base_url} failed ({connection_failure(exc)})") from exc
        if response.status_code != 204:
            raise ServiceUnavailable(f"InfluxDB write answered {response.status_code}: {response.text.strip()}")

    def query(self, influxql: str, method: str = "GET") -> list[dict[str, Any]]:
        """Run InfluxQL; returns the series of the first statement (name, columns, values, tags)."""
        params = {"db": self.settings.database, "q": influxql, "epoch": "ms"}
        try:
            response = self.session.request(method, f"{self.base_url}/query", params=params, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise ServiceUnavailable(f"InfluxDB query to {self.base_url} failed: {exc}") from exc
        if response.status_code != 200:
            raise ServiceUnavailable(f"InfluxDB query answered {response.status_code}: {response.text.strip()}")
        results = response.json().get("results", [{}])
        first = results[0] if results else {}
        if "error" in first:
            raise ValueError(f"InfluxQL error for {influxql!r}: {first['error']}")
        return list(first.get("series", []))


#: Clients kept by :func:`kept_client`, one per configuration.
_kept: dict[str, InfluxV1Client] = {}


def _key(settings: InfluxSettings) -> str:
    secrets = [secret.get_secret_value() for secret in (settings.token, settings.password) if secret]
    return settings.model_dump_json() + repr(secrets)


def kept_client(settings: InfluxSettings) -> InfluxV1Client:
    """A client kept for the process's life (its HTTP connection stays open), for writers
    that write every few hundred milliseconds; :func:`drop_kept_client` after a failure."""
    key = _key(settings)
    client = _kept.get(key)
    if client is None:
        client = _kept[key] = InfluxV1Client(settings)
    return client


def drop_kept_client(settings: InfluxSettings) -> None:
    """Close and forget the kept client (the next :func:`kept_client` opens a fresh one)."""
    client = _kept.pop(_key(settings), None)
    if client is not None:
        client.close()


class OutageLog:
    """Log lines for one writer's failed InfluxDB writes: one as an outage starts, one every
    ``every_s`` while it lasts (with the failures so far) and one when a write succeeds
    again. A writer that writes every micro-batch would otherwise log a line a write for
    the whole outage, burying what else happens meanwhile."""

    def __init__(
        self, logger: logging.Logger, what: str, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.what = what  # e.g. "pipeline health"
        self.every_s = every_s
        self.clock = clock
        self.failures = 0
        self._since: float | None = None  # when the outage started
        self._logged = 0.0  # when it was last logged

    def failed(self, error: Exception) -> None:
        now = self.clock()
        self.failures += 1
        if self._since is None:
            self._since = self._logged = now
            self.logger.warning("%s not written to InfluxDB (the pipeline goes on): %s", self.what, error)
        elif now - self._logged >= self.every_s:
            self._logged = now
            self.logger.warning(
                "%s still not written to InfluxDB after %.0f s (%d failed writes): %s",
                self.what,
                now - self._since,
                self.failures,
                error,
            )

    def written(self) -> None:
        if self._since is not None:
            self.logger.info(
                "%s written to InfluxDB again after %.0f s (%d failed writes)",
                self.what,
                self.clock() - self._since,
                self.failures,
            )
            self._since, self.failures = None, 0


def event_time_ns(ms: int, key: str) -> int:
    """An event's time in nanoseconds: its millisecond plus an offset taken from ``key`` (an
    alert or command id), so two events in one millisecond stay two points and writing the
    same event again overwrites it (what a component replaying its topics does)."""
    return ms * 1_000_000 + zlib.crc32(key.encode()) % 1_000_000
