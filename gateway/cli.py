"""``iotwatch gateway``: run gateway processes until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
from typing import Any

import click

from iotwatch.cli import AppContext, emit, endpoint_options, json_option, pass_app, stop_on_signals
from iotwatch.clients.kafka import ensure_topics

log = logging.getLogger(__name__)


@click.command()
@endpoint_options(mqtt=True, kafka=True, influx=True)
@click.option(
    "--client-id",
    help="MQTT client id (default IOTWATCH_GATEWAY_CLIENT_ID); fixed per instance so "
    "its persistent session survives restarts.",
)
@click.option("--shared-group", help="Subscribe via $share/GROUP/... so several instances split the load.")
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    help="Gateway processes on one shared subscription (default 1); each has its own client id "
    "CLIENT_ID-N, persistent session, producer and metrics port (METRICS_PORT+N); one that dies "
    "is started again.",
)
@click.option("--mqtt-protocol", type=click.Choice(["5", "3.1.1"]), help="MQTT protocol version (default 5).")
@click.option("--max-inflight", type=click.IntRange(min=1), help="Messages awaiting Kafka confirmation (default 2000).")
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0),
    help="Port for /metrics and /health (0 picks a free one; default 9108).",
)
@click.option("--no-metrics-server", is_flag=True, help="Do not serve /metrics and /health.")
@json_option
@pass_app
def gateway(
    app: AppContext,
    client_id: str | None,
    shared_group: str | None,
    processes: int | None,
    mqtt_protocol: str | None,
    max_inflight: int | None,
    metrics_port: int | None,
    no_metrics_server: bool,
    as_json: bool,
) -> None:
    """Bridge MQTT telemetry to Kafka with at-least-once delivery.

    Subscribes with QoS 1 on a persistent session, validates every payload against the
    message contract (invalid ones go to the dead-letter topic with a reason), produces
    to Kafka idempotently and acknowledges each MQTT message only after Kafka confirmed it.
    SIGTERM or Ctrl-C drains in-flight messages before exit; --json prints the final counts.
    """
    from iotwatch.gateway.bridge import Gateway
    from iotwatch.gateway.supervisor import Supervisor, serve

    update: dict[str, Any] = {
        k: v
        for k, v in {
            "client_id": client_id,
            "shared_group": shared_group,
            "mqtt_protocol": mqtt_protocol,
            "max_inflight": max_inflight,
            "metrics_port": metrics_port,
            "processes": processes,
        }.items()
        if v is not None
    }
    if no_metrics_server:
        update["metrics_port"] = None
    settings = app.settings
    settings = settings.model_copy(update={"gateway": settings.gateway.model_copy(update=update)})
    router = Gateway.router_for(settings)
    ensure_topics(settings.kafka, [*router.static_topics(), settings.topics.dlq])
    stop = stop_on_signals()
    if settings.gateway.processes > 1:
        summary = Supervisor(settings, settings.gateway.processes).run(stop)
    else:
        summary = serve(settings, stop)
    emit(
        summary,
        as_json,
        lambda s: click.echo(
            f"gateway stopped: received {s['received']}, forwarded {s['forwarded']}, "
            f"dead-lettered {s['dead_lettered']}, left unacknowledged {s['inflight']}"
        ),
    )
