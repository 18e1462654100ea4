"""MQTT publishing for the simulator: a few shared connections (or one per device), retained
online/offline status with last wills, QoS 1 flow control and ack latency (docs/internals.md,
"Publisher")."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from iotwatch.clients.batch_publish import BatchPublishClient, Outgoing
from iotwatch.clients.mqtt import make_client
from iotwatch.contract.device_topics import DeviceStatus, status_payload
from iotwatch.errors import ServiceUnavailable, UserError
from iotwatch.settings import MqttSettings

__all__ = ["Publisher", "SIMULATOR_STATUS_PREFIX"]

SIMULATOR_STATUS_PREFIX = "iotwatch/simulator"
STATUS_GROUP = -1
MAX_DEVICE_CONNECTIONS = 5000


class _Connection:
    """One connection: a :class:`BatchPublishClient` and whether it is up."""

    def __init__(self, client: BatchPublishClient, client_id: str) -> None:
        self.client = client
        self.client_id = client_id
        self.connected = threading.Event()
        self.connect_error: str | None = None
        client.on_connect = self._on_connect

    def _on_connect(self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if getattr(reason, "is_failure", False):
            self.connect_error = str(reason)
        self.connected.set()


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
        #: connection index of each device (one connection per device), else None: uid % connections
        self._slot_of: dict[int, int] | None = None
        if device_uids is not None:
            if len(device_uids) > MAX_DEVICE_CONNECTIONS:
                raise UserError(
                    f"--connection-per-device supports up to {MAX_DEVICE_CONNECTIONS} devices "
                    f"per process, this one has {len(device_uids)}"
                )
            self._slot_of = {}
            for uid in device_uids:
                self._slot_of[uid] = len(self._conns)
                self._make(f"{prefix}-{uid}", (device_status or {})[uid])
        else:
            for n in range(max(1, connections)):
                client_id = f"{prefix}-{n}"
                self._make(client_id, f"{SIMULATOR_STATUS_PREFIX}/{client_id}/status")
        self.sent = 0
        self._errors = 0  # QoS 0 messages published while their connection was down
        self.status_sent = 0
        self.by_group: dict[int, int] = {}

    def _make(self, client_id: str, will_topic: str) -> _Connection:
        client = make_client(self.settings, client_id, client_class=BatchPublishClient)
        assert isinstance(client, BatchPublishClient)
        client.window = self.window
        client.reconnect_delay_set(0.5, 5)  # type: ignore[arg-type]  # paho annotates int; its back-off sums floats
        client.will_set(
            will_topic, status_payload(DeviceStatus.LOST, int(time.time() * 1000)), qos=self.qos, retain=True
        )
        conn = _Connection(client, client_id)
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
            answered = conn.connected.wait(max(0.0, deadline - time.monotonic()))
            if answered and conn.connect_error:
                self.close(wait_s=0)
                raise ServiceUnavailable(
                    f"MQTT broker {self.settings.url} refused the connection: {conn.connect_error}"
                )
            if not (answered and conn.client.wait_ready(max(0.0, deadline - time.monotonic()))):
                self.close(wait_s=0)
                raise ServiceUnavailable(
                    f"MQTT broker {self.settings.url} did not accept a connection within {self.connect_timeout_s:.0f} s"
                )
        if not self.per_device:
            self._connection_status(online=True)

    def _connection_status(self, online: bool) -> None:
        """Each shared connection's own retained status (its will says ``offline``)."""
        payload = status_payload(DeviceStatus.ONLINE if online else DeviceStatus.OFFLINE, int(time.time() * 1000))
        for conn in self._conns:
            if conn.connected.is_set():
                topic = f"{SIMULATOR_STATUS_PREFIX}/{conn.client_id}/status"
                conn.client.publish_many([(topic, payload, True)], self.qos)

    def publish(self, batch: Iterable[tuple[int, str, Any, int]]) -> None:
        """Publish (uid, topic, payload, group) tuples; group -1 is a retained status.

        The batch is split by connection (a device's messages keep their order) and each
        connection's share goes out as one write."""
        n_conns, slot_of = len(self._conns), self._slot_of
        messages: list[list[Outgoing]] = [[] for _ in range(n_conns)]
        groups: list[list[int]] = [[] for _ in range(n_conns)]
        for uid, topic, payload, group in batch:
            n = slot_of[uid] if slot_of is not None else uid % n_conns
            messages[n].append((topic, payload, group == STATUS_GROUP))
            groups[n].append(group)
        counts: Counter[int] = Counter()
        for conn, outgoing, kinds in zip(self._conns, messages, groups, strict=True):
            if not outgoing:
                continue
            try:
                taken = conn.client.publish_many(outgoing, self.qos)
            except TimeoutError as exc:
                raise ServiceUnavailable(f"MQTT broker {self.settings.url} acknowledged nothing for 30 s") from exc
            if taken < len(outgoing):  # QoS 0 while the connection is down: lost
                self._errors += len(outgoing)
            else:
                counts.update(kinds)
        self.status_sent += counts.pop(STATUS_GROUP, 0)
        for group, n in counts.items():
            self.sent += n
            self.by_group[group] = self.by_group.get(group, 0) + n

    def publish_status(self, devices: Iterable[tuple[int, str]], online: bool) -> None:
        ts = int(time.time() * 1000)
        payload = status_payload(DeviceStatus.ONLINE if online else DeviceStatus.OFFLINE, ts)
        self.publish((uid, topic, payload, STATUS_GROUP) for uid, topic in devices)

    @property
    def errors(self) -> int:
        """Messages lost (QoS 0, connection down) or refused by the broker (an MQTT 5 PUBACK
        with a failure reason)."""
        return self._errors + sum(conn.client.refused for conn in self._conns)

    def latencies_ms(self) -> list[float]:
        values: list[float] = []
        for conn in self._conns:
            values.extend(conn.client.latencies_ms)
        return values

    def unacked(self) -> int:
        return sum(conn.client.pending for conn in self._conns)

    def flush(self, wait_s: float = 30.0) -> bool:
        """Wait until every QoS 1 message is acknowledged and QoS 0 ones are written."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.unacked() == 0 and all(conn.client.written() for conn in self._conns):
                return True
            time.sleep(0.01)
        return False

    def close(self, wait_s: float = 30.0) -> None:
        """Flush, then disconnect cleanly (no will is sent on a clean disconnect)."""
        if wait_s:
            self.flush(wait_s)
        if not self.per_device:
            self._connection_status(online=False)
        if wait_s:
            self.flush(min(wait_s, 5.0))
        for conn in self._conns:
            conn.client.disconnect()
        for conn in self._conns:
            conn.client.loop_stop()
