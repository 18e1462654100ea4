"""The multi-site topology: per site an MQTT broker and a one-node Kafka cluster, linked to the central
Kafka cluster by the site's MirrorMaker 2 (:mod:`iotwatch.application.stack.mirror_maker`)
(docs/internals.md, "Sites topology")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from iotwatch.application.stack.kafka_broker import EDGE_HEAP_OPTIONS, KafkaSecurity, start_kafka_broker
from iotwatch.application.stack.mirror_maker import CENTRAL, ClusterLink, start_mirror_maker
from iotwatch.application.stack.mqtt_broker import start_mqtt_broker
from iotwatch.application.stack.process import stop_process
from iotwatch.application.stack.service import RunningService
from iotwatch.clients.kafka import ensure_topics
from iotwatch.settings import KafkaSettings, TopicSettings

#: The service kinds each site runs, in start order.
SITE_KINDS = ("mqtt", "kafka", "mirror")


def site_names(count: int) -> list[str]:
    """``site1`` .. ``site<count>``: the sites' aliases, prefixes of their topics at the centre."""
    return [f"site{i}" for i in range(1, count + 1)]


def site_role(site: str, kind: str) -> str:
    return f"{site}-{kind}"


def split_role(role: str) -> tuple[str | None, str]:
    """``(site, kind)`` of a service role; a central service has no site."""
    site, sep, kind = role.rpartition("-")
    return (site, kind) if sep and kind in SITE_KINDS else (None, role)


def raw_pattern(topics: TopicSettings) -> str:
    """The regular expression of every site's replica of the raw topic at the centre."""
    return topics.site_replicas(topics.raw)


def edge_topics(topics: TopicSettings) -> list[str]:
    """The topics a site's own cluster carries: what its gateway writes (readings, dead
    letters) and its relay (devices' replies to commands)."""
    return [topics.raw, topics.dlq, topics.replies]


def start_site_servers(
    run_dir: Path,
    site: str,
    mqtt_choice: str,
    kafka: KafkaSettings,
    topics: TopicSettings,
    timeout_s: float,
    security: KafkaSecurity | None = None,
) -> list[RunningService]:
    """The site's MQTT broker and Kafka node in ``run_dir/<site>`` (with ``security``, as the
    centre's), with its topics; ``kafka``: the client settings of the centre."""
    folder = run_dir / site
    mqtt = start_mqtt_broker(folder, mqtt_choice, timeout_s)
    services = [dataclasses.replace(mqtt, role=site_role(site, "mqtt"))]
    try:
        node = start_kafka_broker(folder, timeout_s, heap=EDGE_HEAP_OPTIONS, security=security)
    except BaseException:
        stop_process(mqtt.process)
        raise
    services.append(dataclasses.replace(node, role=site_role(site, "kafka")))
    edge = kafka.model_copy(update={"bootstrap_servers": node.endpoint})
    ensure_topics(edge, edge_topics(topics))
    ensure_topics(edge, [topics.device_twin], compacted=True)  # the twin of a device lives at its site
    return services


def start_site_link(
    run_dir: Path, site: str, edge_endpoint: str, central: KafkaSettings, topics: TopicSettings, timeout_s: float
) -> RunningService:
    """The site's MirrorMaker 2 between its cluster and the centre, connecting to both as
    ``central`` says (over TLS, verifying the brokers' certificates, when it does)."""
    return start_mirror_maker(
        run_dir / site / "mirror",
        ClusterLink.of(site, central.model_copy(update={"bootstrap_servers": edge_endpoint})),
        ClusterLink.of(CENTRAL, central),
        topics,
        central,
        timeout_s,
    )
