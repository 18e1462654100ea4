"""What the gateway counts, and where it shows it: Prometheus, InfluxDB, the status line.

One :class:`GatewayStats` is the single source of truth; the Prometheus collector, the
InfluxDB points and the periodic log line are all views of its snapshot.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from influxdb_client import Point
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from iotwatch.contract.measurements import GATEWAY, GATEWAY_DEAD_LETTERS
from iotwatch.stats import quantiles

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class GatewayStats:
    """Counters and gauges of one gateway instance.

    Each counter is written by one thread only (received, duplicates, seq_gaps and
    devices_forgotten by the MQTT thread; the delivery counts by the Kafka poller), so the
    hot path takes no lock; ``lock`` serialises readers (snapshot, Prometheus)."""

    received: int = 0  # = forwarded + dead_lettered + inflight, at any moment
    forwarded: int = 0  # readings Kafka confirmed on their topic (dead letters not included)
    dead_lettered: Counter[str] = field(default_factory=Counter)  # by reason, confirmed on the dead-letter topic
    delivery_failures: int = 0  # Kafka errors on delivery; the message is produced again
    duplicates: int = 0  # seq not above the device's last forwarded seq (redelivery or device resend)
    seq_gaps: int = 0  # seqs skipped between consecutive messages of a device
    devices_forgotten: int = 0  # devices dropped from the seq map past its cap (max_devices)
    inflight: int = 0
    oldest_inflight_s: float = 0.0
    #: event-time age of the newest reading received (the devices' clocks against this one's):
    #: how far the gateway runs behind the devices, e.g. a backlog the MQTT broker still holds
    newest_reading_age_s: float = 0.0
    kafka_up: bool = False
    mqtt_connected: bool = False
    latency_buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    latency_sum_s: float = 0.0
    recent_latencies_s: deque[float] = field(default_factory=lambda: deque(maxlen=20_000))
    started_at: float = field(default_factory=time.time)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe_delivery(self, latency_s: float, dead_letter_reason: str | None) -> None:
        """Called by the one thread that serves delivery reports (each counter has one writer):
        a confirmed record is either forwarded or dead-lettered, never both."""
        if dead_letter_reason is None:
            self.forwarded += 1
        else:
            self.dead_lettered[dead_letter_reason] += 1
        self.latency_sum_s += latency_s
        self.recent_latencies_s.append(latency_s)
        self.latency_buckets[bisect.bisect_left(LATENCY_BUCKETS_S, latency_s)] += 1

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            latencies_ms = [s * 1000 for s in list(self.recent_latencies_s)]  # list(): one atomic copy
            delivery = quantiles(latencies_ms, (0.5, 0.99), digits=3)
            return {
                "received": self.received,
                "forwarded": self.forwarded,
                "dead_lettered": sum(self.dead_lettered.values()),
                "dead_letter_reasons": dict(self.dead_lettered),
                "delivery_failures": self.delivery_failures,
                "duplicates": self.duplicates,
                "seq_gaps": self.seq_gaps,
                "devices_forgotten": self.devices_forgotten,
                "inflight": self.inflight,
                "oldest_inflight_s": round(self.oldest_inflight_s, 3),
                "newest_reading_age_s": round(self.newest_reading_age_s, 3),
                "kafka_up": self.kafka_up,
                "mqtt_connected": self.mqtt_connected,
                "delivery_latency_ms_p50": delivery["p50"],
                "delivery_latency_ms_p99": delivery["p99"],
                "uptime_s": round(time.time() - self.started_at, 1),
                "started_ms": int(self.started_at * 1000),
            }


class _StatsCollector(Collector):
    """The stats as Prometheus families; ``refresh`` sets the gauges first, so a scrape reads
    them as of now, not as of the last status period."""

    def __init__(self, stats: GatewayStats, instance: str, refresh: Callable[[], None] | None = None) -> None:
        self.stats = stats
        self.instance = instance
        self.refresh = refresh

    def collect(self) -> Iterator[Any]:
        if self.refresh is not None:
            self.refresh()
        s = self.stats
        labels = ["instance"]
        with s.lock:
            for name, doc, value in (
                ("received", "MQTT messages received", s.received),
                ("forwarded", "readings confirmed by Kafka (dead letters not included)", s.forwarded),
                ("delivery_failures", "Kafka delivery errors (message produced again)", s.delivery_failures),
                ("duplicates", "messages whose seq was not above the device's last one", s.duplicates),
                ("seq_gaps", "seqs missing between consecutive messages of a device", s.seq_gaps),
                ("devices_forgotten", "devices dropped from the seq map past max_devices", s.devices_forgotten),
            ):
                family = CounterMetricFamily(f"iotwatch_gateway_{name}", doc, labels=labels)
                family.add_metric([self.instance], value)
                yield family
            dead = CounterMetricFamily(
                "iotwatch_gateway_dead_lettered",
                "messages sent to the dead-letter topic",
                labels=["instance", "reason"],
            )
            for reason, count in sorted(s.dead_lettered.items()):
                dead.add_metric([self.instance, reason], count)
            yield dead
            for name, doc, level in (
                (
                    "inflight",
                    "messages received, not yet confirmed by Kafka (not yet acknowledged to MQTT)",
                    s.inflight,
                ),
                ("oldest_inflight_seconds", "age of the oldest unconfirmed message", s.oldest_inflight_s),
                (
                    "newest_reading_age_seconds",
                    "event-time age of the newest reading received (how far behind the devices)",
                    s.newest_reading_age_s,
                ),
                ("kafka_up", "1 while Kafka is reachable", int(s.kafka_up)),
                ("mqtt_connected", "1 while connected to the MQTT broker", int(s.mqtt_connected)),
            ):
                gauge = GaugeMetricFamily(f"iotwatch_gateway_{name}", doc, labels=labels)
                gauge.add_metric([self.instance], level)
                yield gauge
            cumulative, buckets = 0, []
            for bound, count in zip((*LATENCY_BUCKETS_S, float("inf")), s.latency_buckets, strict=True):
                cumulative += count
                buckets.append((str(bound) if bound != float("inf") else "+Inf", cumulative))
            histogram = HistogramMetricFamily(
                "iotwatch_gateway_delivery_latency_seconds", "MQTT receipt to Kafka confirmation", labels=labels
            )
            histogram.add_metric([self.instance], buckets, s.latency_sum_s)
            yield histogram


class MetricsServer:
    """Serves ``/metrics`` (Prometheus text) and ``/health`` (200 or 503 with a reason)."""

    def __init__(
        self,
        stats: GatewayStats,
        instance: str,
        health: Callable[[], tuple[bool, str]],
        host: str,
        port: int,
        refresh: Callable[[], None] | None = None,
    ) -> None:
        registry = CollectorRegistry()
        registry.register(_StatsCollector(stats, instance, refresh))
        metrics_app = make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
            if environ.get("PATH_INFO") == "/health":
                healthy, reason = health()
                start_response(
                    "200 OK" if healthy else "503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")]
                )
                return [f"{'ok' if healthy else 'unhealthy'}: {reason}\n".encode()]
            body: list[bytes] = metrics_app(environ, start_response)  # prometheus_client's app is untyped
            return body

        class _QuietHandler(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server: WSGIServer = make_server(host, port, app, handler_class=_QuietHandler)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="gateway-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def wait_healthy(port: int, host: str = "127.0.0.1", timeout_s: float = 60.0) -> None:
    """Block until a gateway's ``/health`` answers 200 (scripts, benchmarks, tests)."""
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://{host}:{port}/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the gateway on port {port} did not report healthy within {timeout_s:.0f} s")


def scrape(url: str) -> dict[str, float]:
    """A gateway's ``/metrics`` at ``url``: each metric by its name without the
    ``iotwatch_gateway_`` prefix and ``_total`` suffix, summed over its labels (dead letters
    over their reasons); histogram buckets left out. Empty if the gateway does not answer."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = requests.get(url, timeout=1).text
    except requests.RequestException:
        return {}
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("iotwatch_gateway_") and not sample.name.endswith(("_bucket", "_created")):
                key = sample.name.removeprefix("iotwatch_gateway_").removesuffix("_total")
                values[key] = values.get(key, 0.0) + sample.value
    return values


def influx_points(snapshot: dict[str, Any], instance: str, ts_ms: int) -> list[Point]:
    """The ``gateway`` measurement (one point per status period) and dead letters by reason.

    Each reason's counter is also written as 0 at the gateway's start (the same point every
    time, so InfluxDB keeps one): the dashboards' increase of a counter needs a value before
    its first one, or a reason's first dead letters would show nowhere."""
    counters = ("received", "forwarded", "dead_lettered", "delivery_failures", "duplicates", "seq_gaps", "inflight")
    fields: dict[str, float | int | None] = {name: int(snapshot[name]) for name in counters}
    fields |= {
        "oldest_inflight_s": float(snapshot["oldest_inflight_s"]),
        "newest_reading_age_s": float(snapshot["newest_reading_age_s"]),
        "kafka_up": int(snapshot["kafka_up"]),
        "mqtt_connected": int(snapshot["mqtt_connected"]),
        "delivery_latency_ms_p50": snapshot["delivery_latency_ms_p50"],
        "delivery_latency_ms_p99": snapshot["delivery_latency_ms_p99"],
    }
    points = [GATEWAY.point({"instance": instance}, fields, ts_ms)]
    started_ms = snapshot.get("started_ms")
    for reason, count in snapshot["dead_letter_reasons"].items():
        tags = {"instance": instance, "reason": reason}
        if started_ms is not None and started_ms < ts_ms:
            points.append(GATEWAY_DEAD_LETTERS.point(tags, {"count": 0}, started_ms))
        points.append(GATEWAY_DEAD_LETTERS.point(tags, {"count": int(count)}, ts_ms))
    return points


def status_line(snapshot: dict[str, Any]) -> str:
    return (
        "gateway: received={received} forwarded={forwarded} dead_lettered={dead_lettered} "
        "inflight={inflight} failures={delivery_failures} duplicates={duplicates} gaps={seq_gaps} "
        "kafka={kafka} mqtt={mqtt} latency_p99_ms={delivery_latency_ms_p99}"
    ).format(
        kafka="up" if snapshot["kafka_up"] else "DOWN", mqtt="up" if snapshot["mqtt_connected"] else "DOWN", **snapshot
    )
