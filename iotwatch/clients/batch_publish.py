"""A paho client that publishes many messages with one write and keeps QoS 1 itself (docs/internals.md,
"Batch publishing over MQTT"). It overrides private methods of paho 2, which the pyproject pins below 3."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal, overload

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion

from iotwatch.clients.mqtt import BufferedReadClient

__all__ = ["LATENCY_SAMPLES", "BatchPublishClient", "Outgoing"]

#: (topic, payload, retain)
Outgoing = tuple[str, "bytes | str", bool]

#: latencies kept per client (a uniform sample once there are more)
LATENCY_SAMPLES = 100_000
_DUP = 0x08
_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux
_MAX_MID = 65535


def _fixed_header(command: int, retain: bool, remaining: int) -> bytes:
    """PUBLISH's first byte and the remaining length (MQTT's variable-length integer)."""
    out = bytearray((command | retain,))
    while True:
        byte, remaining = remaining & 0x7F, remaining >> 7
        out.append(byte | 0x80 if remaining else byte)
        if not remaining:
            return bytes(out)


#: remaining lengths up to this take one or two bytes: their fixed headers are looked up
_SHORT = 16_384
#: _HEADS[qos][retain][remaining length], built once (about 2 MB)
_HEADS = [
    [[_fixed_header(0x30 | (qos << 1), bool(retain), n) for n in range(_SHORT)] for retain in (0, 1)] for qos in (0, 1)
]


class BatchPublishClient(BufferedReadClient):
    """Publishes batches as single writes; QoS 1 flow control, ack latency and resend."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.window = 200
        #: in flight: packet id -> (packet, time sent by perf_counter or -1 for untimed), publish order
        self.unacked: dict[int, tuple[bytes, float]] = {}
        #: built, waiting for room in the window: (packet id, packet, retained)
        self._backlog: deque[tuple[int, bytes, bool]] = deque()
        self.published = 0  # QoS 1 messages taken (publishing thread only)
        self.acked = 0  # PUBACKs received (network thread only)
        self.refused = 0  # PUBACKs with a failure reason code (MQTT 5)
        #: sending to PUBACK of QoS 1 messages not retained (retained ones are states, such
        #: as a device's online status, not the readings whose latency matters): all of them
        #: up to LATENCY_SAMPLES, then a uniform sample of that many (memory stays bounded)
        self.latencies_ms: list[float] = []
        self.timed = 0  # acknowledged messages that were timed
        self._sample = random.Random(0)
        self._room = threading.Event()
        self._waiting = False
        self._lock = threading.RLock()
        self._ready = False  # connected, and whatever was unacknowledged is queued again
        self._ready_event = threading.Event()
        self._mid = 0
        self._topics: dict[str, bytes] = {}
        self._properties = b"\x00" if self._protocol == MQTTProtocolVersion.MQTTv5 else b""

    @property
    def pending(self) -> int:
        """QoS 1 messages not acknowledged yet (in flight or waiting)."""
        return self.published - self.acked

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until connected and what was in flight is queued again (``on_connect``
        runs just before that)."""
        return self._ready_event.wait(timeout_s)

    def written(self) -> bool:
        """Nothing is waiting in paho's write queue."""
        return not self._out_packet

    def publish_many(self, messages: Sequence[Outgoing], qos: int, *, timeout_s: float = 30.0) -> int:
        """Publish ``messages`` in order; returns how many were taken (at QoS 0, none while
        not connected; at QoS 1 all: they go out once connected). Raises TimeoutError when the
        broker acknowledges nothing for ``timeout_s`` with the window full."""
        if qos == 0:
            with self._lock:
                if not self._ready:
                    return 0
                self._queue(b"".join(self._packets(messages, 0)))
            return len(messages)
        limit = min(2 * self.window, _MAX_MID - 1)  # in flight and waiting; packet ids stay unique
        done = 0
        while done < len(messages):
            room = limit - self.pending
            if room <= 0:
                if not self._wait_for_room(timeout_s):
                    raise TimeoutError(f"no PUBACK for {timeout_s:.0f} s with {self.pending} messages in flight")
                continue
            chunk = messages[done : done + room]
            with self._lock:
                packets = self._packets(chunk, 1)
                self._backlog.extend(
                    (mid, packet, retain) for (mid, packet), (_, _, retain) in zip(packets.items(), chunk, strict=True)
                )
                self.published += len(packets)
                self._send_backlog()
            done += len(chunk)
        return done

    def _send_backlog(self) -> None:
        """Move waiting messages into the free part of the window, as one write (holding the lock)."""
        room = self.window - len(self.unacked)
        if not self._ready or room <= 0 or not self._backlog:
            return
        started = time.perf_counter()
        backlog, unacked = self._backlog, self.unacked
        parts = []
        for _ in range(min(room, len(backlog))):
            mid, packet, retain = backlog.popleft()
            unacked[mid] = (packet, -1.0 if retain else started)
            parts.append(packet)
        self._queue(b"".join(parts))

    @overload
    def _packets(self, messages: Sequence[Outgoing], qos: Literal[0]) -> list[bytes]: ...
    @overload
    def _packets(self, messages: Sequence[Outgoing], qos: Literal[1]) -> dict[int, bytes]: ...
    def _packets(self, messages: Sequence[Outgoing], qos: Literal[0, 1]) -> list[bytes] | dict[int, bytes]:
        """PUBLISH packets: a list at QoS 0, a dict packet id -> packet at QoS 1."""
        topics, props = self._topics, self._properties
        heads = _HEADS[qos]  # fixed header of a remaining length below 16,384, by retain and length
        if qos == 0:
            out: list[bytes] = []
            for topic, payload, retain in messages:
                body = topics.get(topic) or self._topic(topic)
                data = payload.encode() if isinstance(payload, str) else payload
                size = len(body) + len(props) + len(data)
                head = heads[retain][size] if size < _SHORT else _fixed_header(0x30, retain, size)
                out.append(head + body + props + data)
            return out
        keyed: dict[int, bytes] = {}
        mid = self._mid
        for topic, payload, retain in messages:
            body = topics.get(topic) or self._topic(topic)
            data = payload.encode() if isinstance(payload, str) else payload
            mid = mid % _MAX_MID + 1
            size = len(body) + 2 + len(props) + len(data)
            head = heads[retain][size] if size < _SHORT else _fixed_header(0x32, retain, size)
            keyed[mid] = head + body + mid.to_bytes(2, "big") + props + data
        self._mid = mid
        return keyed

    def _topic(self, topic: str) -> bytes:
        encoded = topic.encode()
        if len(self._topics) > 1_000_000:
            self._topics.clear()
        self._topics[topic] = body = len(encoded).to_bytes(2, "big") + encoded
        return body

    def _queue(self, data: bytes) -> None:
        if data:
            self._packet_queue(paho.PUBLISH, data, 0, 1)  # qos 1: paho calls no on_publish for the write

    def _wait_for_room(self, timeout_s: float) -> bool:
        self._room.clear()
        self._waiting = True
        try:
            while self.pending >= min(2 * self.window, _MAX_MID - 1):
                if not self._room.wait(timeout_s):
                    return False
                self._room.clear()
            return True
        finally:
            self._waiting = False

    # -- paho's network thread ------------------------------------------------------------

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:
        """Read, then acknowledge what was read at once (TCP_QUICKACK). mosquitto sends
        PUBACKs with Nagle's algorithm on: after the first PUBACK of a batch the others wait
        for its TCP ACK, which the kernel delays (up to 40 ms) while this client, its window
        full, has nothing to send that could carry it, so without the quick ACK a window of
        QoS 1 messages waits on delayed ACKs instead of the network."""
        rc = super().loop_read(max_packets)
        sock = self._sock
        if _QUICKACK is not None and isinstance(sock, socket.socket):  # TCP or TLS, not a websocket
            try:
                sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:
                pass
        return rc

    def _handle_connack(self) -> MQTTErrorCode:
        rc = super()._handle_connack()
        if self.is_connected():
            with self._lock:
                if self.unacked:  # again, in publish order, flagged as duplicates
                    self._queue(b"".join(bytes((p[0] | _DUP,)) + p[1:] for p, _ in self.unacked.values()))
                self._ready = True
                self._ready_event.set()
                self._send_backlog()
        return rc

    def _handle_pubackcomp(self, cmd: Any) -> MQTTErrorCode:
        packet = self._in_packet["packet"]
        entry = self.unacked.pop((packet[0] << 8) | packet[1], None) if cmd == "PUBACK" else None
        if entry is None:
            return super()._handle_pubackcomp(cmd)
        if len(packet) > 2 and packet[2] >= 0x80:
            self.refused += 1
        if entry[1] >= 0:
            self._keep_latency((time.perf_counter() - entry[1]) * 1000.0)
        self.acked += 1
        if self._backlog and len(self.unacked) <= self.window // 2:
            with self._lock:
                self._send_backlog()
        if self._waiting and self.pending <= self.window:
            self._room.set()
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _keep_latency(self, value: float) -> None:
        """Reservoir sampling (Algorithm R): every timed message equally likely kept."""
        self.timed += 1
        if len(self.latencies_ms) < LATENCY_SAMPLES:
            self.latencies_ms.append(value)
        else:
            slot = self._sample.randrange(self.timed)
            if slot < LATENCY_SAMPLES:
                self.latencies_ms[slot] = value

    def _sock_close(self) -> None:
        with self._lock:
            self._ready = False
            self._ready_event.clear()
        super()._sock_close()
