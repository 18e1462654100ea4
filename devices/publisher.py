"""MQTT publishing for the simulator: a few shared connections (or one per device),
retained online/offline status with last wills, QoS 1 flow control and ack latency.

Connections come from :func:`iotwatch.clients.mqtt.make_client` (credentials and TLS).
Each runs paho's network thread; messages of device ``uid`` go over connection
``uid % connections`` so a device's messages stay in order.

MQTT allows one last will per connection. With ``per_device`` every device connects on
its own and its will is its own retained ``offline`` status; with shared connections
the will marks the connection (``iotwatch/simulator/<client id>/status``) and the
simulator publishes every device's ``offline`` itself when it stops.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import paho.mqtt.client as paho

from iotwatch.clients.mqtt import make_client
from iotwatch.contract.device_topics import status_payload
from iotwatch.errors import ServiceUnavailable
from iotwatch.settings import MqttSettings

__all__ = ["Publisher", "SIMULATOR_STATUS_PREFIX"]

SIMULATOR_STATUS_PREFIX = "iotwatch/simulator"
STATUS_GROUP = -1
MAX_DEVICE_CONNECTIONS = 5000


class _Connection:
    """One paho client and its QoS 1 bookkeeping.

    ``published`` is written only by the publishing thread and ``acked`` only by paho's
    network thread, so the window needs no lock per message. A PUBACK can arrive before
    its mid is registered; ``sent_at``/``acked_early`` are resolved with atomic dict pops
    so each ack is counted once, whichever thread gets there first.
    """

    def __init__(self, client: paho.Client, client_id: str, window: int, track_latency: bool) -> None:
        self.client = client
        self.client_id = client_id
        self.window = window
        self.published = 0
        self.acked = 0
        self.waiting = False
        self.room = threading.Event()
        self.connected = threading.Event()
        self.connect_error: str | None = None
        self.sent_at: dict[int, float] = {}
        self.acked_early: dict[int, float] = {}
        self.latencies: list[float] = []
        client.on_connect = self._on_connect
        if track_latency:  # QoS 1: count acknowledgements (QoS 0 needs no callback)
            client.on_publish = self._on_publish

    @property
    def pending(self) -> int:
        return self.published - self.acked

    def _on_connect(self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if getattr(reason, "is_failure", False):
            self.connect_error = str(reason)
        self.connected.set()

    def _on_publish(self, _client: Any, _userdata: Any, mid: int, _reason: Any, _props: Any) -> None:
        now = time.perf_counter()
        started = self.sent_at.pop(mid, None)
        if started is None:
            self.acked_early[mid] = now
            started = self.sent_at.pop(mid, None)  # registered meanwhile?
            if started is None or self.acked_early.pop(mid, None) is None:
                return  # the publishing thread will count it
        self._acked(started, now)

    def register(self, mid: int, started: float) -> None:
        self.published += 1
        self.sent_at[mid] = started
        acked = self.acked_early.pop(mid, None)
        if acked is not None and self.sent_at.pop(mid, None) is not None:
            self._acked(started, acked)

    def _acked(self, started: float, acked: float) -> None:
        if started >= 0:
            self.latencies.append((acked - started) * 1000.0)
        self.acked += 1
        if self.waiting and self.published - self.acked <= self.window // 2:
            self.room.set()

    def wait_for_room(self, timeout_s: float) -> bool:
        self.room.clear()
        self.waiting = True
        try:
            while self.published - self.acked >= self.window:
                if not self.room.wait(timeout_s):
                    return False
                self.room.clear()
            return True
        finally:
            self.waiting = False


#: paho's answers to a QoS 1 publish that it keeps: sent now, or (not connected, e.g. the
#: broker restarting) kept in the client and sent after it reconnects, as every message not
#: yet acknowledged is. Counted as an error before, the simulator exited 1 after a broker
#: restart that lost nothing; now such a message fills the in-flight window like any other,
#: so a long outage blocks publishing (ServiceUnavailable after 30 s) instead of queuing
#: without bound.
_KEPT = (paho.MQTT_ERR_SUCCESS, paho.MQTT_ERR_NO_CONN)


class Publisher:
    def __init__(
        self,
        settings: MqttSettings,
        *,
        qos: int,
        connections: int = 1,
        device_uids: Sequence[int] | None = None,
        device_status: dict[int, str] | None = None,
        client_prefix: str | None = None,
        max_inflight: int = 200,
        connect_timeout_s: float = 15.0,
    ) -> None:
        """``device_uids`` given means one connection per device, each with the will
        ``offline`` on ``device_status[uid]``."""
        self.settings = settings
        self.qos = qos
        self.window = max_inflight
        self.connect_timeout_s = connect_timeout_s
        prefix = client_prefix or f"iotwatch-sim-{uuid.uuid4().hex[:8]}"
        self.per_device = device_uids is not None
        self._conns: list[_Connection] = []
        self._by_uid: dict[int, _Connection] = {}
        if device_uids is not None:
            if len(device_uids) > MAX_DEVICE_CONNECTIONS:
                raise ValueError(
                    f"--connection-per-device supports up to {MAX_DEVICE_CONNECTIONS} devices "
                    f"per process, this one has {len(device_uids)}"
                )
            for uid in device_uids:
                topic = (device_status or {})[uid]
                conn = self._make(f"{prefix}-{uid}", topic)
                self._by_uid[uid] = conn
        else:
            for n in range(max(1, connections)):
                client_id = f"{prefix}-{n}"
                self._make(client_id, f"{SIMULATOR_STATUS_PREFIX}/{client_id}/status")
        self.sent = 0
        self.errors = 0
        self.status_sent = 0
        self.by_group: dict[int, int] = {}

    def _make(self, client_id: str, will_topic: str) -> _Connection:
        client = make_client(self.settings, client_id)
        client.max_inflight_messages_set(self.window)
        client.max_queued_messages_set(0)
        client.reconnect_delay_set(0.5, 5)
        client.will_set(will_topic, status_payload(False, int(time.time() * 1000)), qos=self.qos, retain=True)
        conn = _Connection(client, client_id, self.window, track_latency=self.qos == 1)
        self._conns.append(conn)
        return conn

    @property
    def connections(self) -> int:
        return len(self._conns)

    def connect(self) -> None:
        for conn in self._conns:
            try:
                conn.client.connect(self.settings.host, self.settings.port, keepalive=self.settings.keepalive_s)
            except (OSError, ValueError) as exc:
                self.close(wait_s=0)
                raise ServiceUnavailable(f"MQTT broker {self.settings.url} refused the connection: {exc}") from exc
            conn.client.loop_start()
        deadline = time.monotonic() + self.connect_timeout_s
        for conn in self._conns:
            if not conn.connected.wait(max(0.0, deadline - time.monotonic())):
                self.close(wait_s=0)
                raise ServiceUnavailable(
                    f"MQTT broker {self.settings.url} did not accept a connection within {self.connect_timeout_s:.0f} s"
                )
            if conn.connect_error:
                self.close(wait_s=0)
                raise ServiceUnavailable(
                    f"MQTT broker {self.settings.url} refused the connection: {conn.connect_error}"
                )
        if not self.per_device:
            for conn in self._conns:
                conn.client.publish(
                    f"{SIMULATOR_STATUS_PREFIX}/{conn.client_id}/status",
                    status_payload(True, int(time.time() * 1000)),
                    qos=self.qos,
                    retain=True,
                )

    def _conn(self, uid: int) -> _Connection:
        return self._by_uid[uid] if self.per_device else self._conns[uid % len(self._conns)]

    def publish(self, batch: Iterable[tuple[int, str, Any, int]]) -> None:
        """Publish (uid, topic, payload, group) tuples; group -1 is a retained status."""
        conns, n_conns, by_uid = self._conns, len(self._conns), self._by_uid
        qos, per_device = self.qos, self.per_device
        by_group = self.by_group
        sent = errors = status = 0
        for uid, topic, payload, group in batch:
            conn = by_uid[uid] if per_device else conns[uid % n_conns]
            retain = group == STATUS_GROUP
            if qos:
                if conn.published - conn.acked >= conn.window and not conn.wait_for_room(30.0):
                    raise ServiceUnavailable(f"MQTT broker {self.settings.url} acknowledged nothing for 30 s")
                started = time.perf_counter() if not retain else -1.0
                info = conn.client.publish(topic, payload, 1, retain)
                if info.rc in _KEPT:
                    conn.register(info.mid, started)
            elif retain:
                info = conn.client.publish(topic, payload, 0, True)
            else:
                info = conn.client.publish(topic, payload, 0, False)
            if info.rc and not (qos and info.rc in _KEPT):
                errors += 1
            elif retain:
                status += 1
            else:
                sent += 1
                by_group[group] = by_group.get(group, 0) + 1
        self.sent += sent
        self.errors += errors
        self.status_sent += status

    def publish_status(self, devices: Iterable[tuple[int, str]], online: bool) -> None:
        ts = int(time.time() * 1000)
        payload = status_payload(online, ts)
        self.publish((uid, topic, payload, STATUS_GROUP) for uid, topic in devices)

    def latencies_ms(self) -> list[float]:
        values: list[float] = []
        for conn in self._conns:
            values.extend(conn.latencies)
        return values

    def unacked(self) -> int:
        return sum(conn.pending for conn in self._conns)

    def flush(self, wait_s: float = 30.0) -> bool:
        """Wait until every QoS 1 message is acknowledged and QoS 0 ones are written."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.unacked() == 0 and all(not conn.client._out_packet for conn in self._conns):
                return True
            time.sleep(0.01)
        return False

    def close(self, wait_s: float = 30.0) -> None:
        """Flush, then disconnect cleanly (no will is sent on a clean disconnect)."""
        if wait_s:
            self.flush(wait_s)
        for conn in self._conns:
            if not self.per_device and conn.connected.is_set():
                conn.client.publish(
                    f"{SIMULATOR_STATUS_PREFIX}/{conn.client_id}/status",
                    status_payload(False, int(time.time() * 1000)),
                    qos=self.qos,
                    retain=True,
                )
        if wait_s:
            self.flush(min(wait_s, 5.0))
        for conn in self._conns:
            conn.client.disconnect()
        for conn in self._conns:
            conn.client.loop_stop()
