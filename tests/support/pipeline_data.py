"""Real data for the dashboard queries: a short run of the streaming job plus gateway reports.

The streaming job runs (Spark local, the real Apache Kafka broker, the real InfluxDB) on
the scenario of tests/support/scenario.py (thermostats, a leak sensor, a vehicle with a
crash) plus a second vehicle that reports GPS positions; gateway status reports are written
with iotwatch.gateway.metrics.influx_points from a real GatewayStats snapshot. Everything goes to a
fresh InfluxDB database.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from iotwatch.alerts.actions import acknowledge
from iotwatch.alerts.book import load_book
from iotwatch.alerts.metrics import LifecycleMetrics
from iotwatch.clients.influx import InfluxV1Client
from iotwatch.clients.kafka import ensure_topics
from iotwatch.contract.oncall import CommandAudit, CommandOutcome
from iotwatch.contract.telemetry import Telemetry
from iotwatch.gateway.metrics import GatewayStats, influx_points
from iotwatch.responder.metrics import write_command
from iotwatch.settings import Settings
from tests.support.scenario import write_scenario


@dataclass
class DashboardData:
    settings: Settings  # its influx.database holds the data
    site: str
    device: str  # a thermostat with an anomaly alert
    vehicles: list[str]  # the crash car and the GPS car
    instance: str  # gateway instance
    metric: str = "temperature_c"


def dashboard_settings(settings: Settings, run: str) -> Settings:
    topics = settings.topics.model_copy(
        update={
            "raw": f"dash.{run}.raw",
            "dlq": f"dash.{run}.dlq",
            "alerts": f"dash.{run}.alerts",
            "model_updates": f"dash.{run}.model",
            "alert_state": f"dash.{run}.alerts.state",
            "silences": f"dash.{run}.alerts.silences",
        }
    )
    stream = settings.stream.model_copy(update={"silence_timeout_s": 3600.0, "max_offsets_per_trigger": 500})
    influx = settings.influx.model_copy(update={"database": f"dashboards_{run}"})
    return settings.model_copy(update={"topics": topics, "stream": stream, "influx": influx})


def write_gps_vehicle(settings: Settings, run: str, readings: int = 180) -> str:
    """A vehicle driving north-east from Lisbon at 1 Hz, over the scenario's hour-old event time."""
    device = f"gps-{run}"
    t0 = int(time.time() * 1000) - 3_600_000
    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True})
    for seq in range(readings):
        metrics = {
            "speed_kmh": 60.0,
            "accel_x_g": 0.01,
            "lat_deg": 38.72 + seq * 1e-4,
            "lon_deg": -9.14 + seq * 1e-4,
            "coolant_temp_c": 90.0,
        }
        message = Telemetry(
            v=1,
            device_id=device,
            device_type="vehicle_edr",
            site=f"site-{run}",
            seq=seq,
            ts=t0 + seq * 1000,
            metrics=metrics,
        )
        producer.produce(settings.topics.raw, key=device.encode(), value=message.to_json())
    assert producer.flush(30) == 0
    return device


def write_wet_leak_sensor(settings: Settings, run: str, readings: int = 20) -> str:
    """A leak sensor that turns wet at the end of the run and stays wet: its water_leak alert
    is still open when the run ends (what on-call acknowledges in the fixture)."""
    device = f"wet-{run}"
    t0 = int(time.time() * 1000) - 600_000
    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True})
    for seq in range(readings):
        metrics = {"water_detected": 1.0 if seq >= readings // 2 else 0.0, "battery_pct": 80.0, "temperature_c": 18.0}
        message = Telemetry(
            v=1,
            device_id=device,
            device_type="leak_sensor",
            site=f"site-{run}",
            seq=seq,
            ts=t0 + seq * 10_000,
            metrics=metrics,
        )
        producer.produce(settings.topics.raw, key=device.encode(), value=message.to_json())
    assert producer.flush(30) == 0
    return device


def write_gateway_reports(settings: Settings, instance: str, reports: int = 6) -> None:
    """Status reports a minute apart, as a running gateway writes them (cumulative counters)."""
    now = int(time.time() * 1000)
    # started before its first report, as a gateway is
    stats = GatewayStats(kafka_up=True, mqtt_connected=True, started_at=(now - reports * 60_000) / 1000)
    client = InfluxV1Client(settings.influx)
    try:
        for i in range(reports):
            with stats.lock:
                stats.received += 600
                for _ in range(590):
                    stats.observe_delivery(0.004 + 0.001 * (i % 3), None)
                for reason in ["invalid_json"] * 4 + ["missing_field"] * 2:  # received = forwarded + dead_lettered
                    stats.observe_delivery(0.004, reason)
                stats.duplicates += 3
                stats.seq_gaps += 1
                stats.delivery_failures += i % 2
                stats.inflight, stats.oldest_inflight_s = 4, 0.2
            client.write_points(influx_points(stats.snapshot(), instance, now - (reports - 1 - i) * 60_000))
    finally:
        client.close()


def write_replication_lag(settings: Settings, run: str, samples: int = 6) -> None:
    """Replication lag of two sites a minute apart, as the sites' monitor writes it."""
    from iotwatch.application.stack.replication import write_lag

    now = int(time.time() * 1000)
    client = InfluxV1Client(settings.influx)
    try:
        for i in range(samples):
            lags = {f"site1-{run}": 900 + i, f"site2-{run}": 1100 + 10 * i}
            write_lag(client, lags, now - (samples - 1 - i) * 60_000)
    finally:
        client.close()


def write_oncall_activity(settings: Settings, device: str) -> None:
    """On-call acknowledges an alert still open after the run; the lifecycle points are written
    as the forwarder writes them, from the alerts the run raised and cleared; and ``device``
    was sent a command (the point the responder writes for each step of it)."""
    book = load_book(settings)
    view = next(book.select(open_only=True))
    acknowledge(settings, book, view.alert_id, "alice", "checking the sensor")
    metrics = LifecycleMetrics(InfluxV1Client(settings.influx))
    try:
        for alert in book.alerts.values():
            metrics.observe(alert)
        metrics.flush(book, int(time.time() * 1000), force=True)
        assert not metrics.pending and metrics.failures == 0
        now = int(time.time() * 1000)
        command = CommandAudit(
            1,
            "c-dash",
            "reset-stuck-hvac",
            view.alert_id,
            "stuck_hvac",
            device,
            "thermostat",
            view.record.site,
            "reset_hvac",
            "responder",
            now - 60_000,
            now,
            1,
            CommandOutcome.DONE,
        ).with_step(CommandOutcome.DONE, now - 59_000)
        assert write_command(metrics.client, command)
    finally:
        metrics.client.close()


def populate(spark: Any, base: Settings, run: str, work_dir: Path) -> DashboardData:
    from iotwatch.streaming.job import start

    settings = dashboard_settings(base, run)
    client = InfluxV1Client(settings.influx)
    client.create_database()
    client.close()
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    scenario = write_scenario(settings, run)
    gps = write_gps_vehicle(settings, run)
    write_wet_leak_sensor(settings, run)
    job = start(
        spark,
        settings,
        checkpoint_dir=work_dir / "checkpoint",
        archive_dir=work_dir / "archive",
        available_now=True,
        query_name=f"dashboards_{run}",
    )
    job.await_backlog(300)
    assert job.query.exception() is None
    instance = f"gw-{run}"
    write_gateway_reports(settings, instance)
    write_replication_lag(settings, run)
    device = next(d for d, rule in scenario.expected_alerts.items() if rule == "anomaly_score")
    write_oncall_activity(settings, device)
    return DashboardData(settings, f"site-{run}", device, [f"car-{run}", gps], instance)
