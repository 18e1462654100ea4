"""Apache Kafka's MirrorMaker 2: the link between one site's Kafka cluster and the central one,
a dedicated MirrorMaker process per site so that a site whose link is down holds up no other.
docs/sites.md describes its two flows, their topics and its at-least-once delivery.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from iotwatch.application.stack.kafka_broker import LOG4J_CONFIG as BROKER_LOG4J_CONFIG
from iotwatch.application.stack.kafka_broker import escape_property
from iotwatch.application.stack.process import ProcessRecord, start_process, wait_until
from iotwatch.application.stack.service import RunningService
from iotwatch.clients.kafka import java_client_properties, list_topics
from iotwatch.jvm.jars import KAFKA_VERSION, java_executable, mirror_maker
from iotwatch.settings import KafkaSettings, TopicSettings

IMPLEMENTATION = f"apache-kafka-mirrormaker2 {KAFKA_VERSION}"
MAIN_CLASS = "org.apache.kafka.connect.mirror.MirrorMaker"
#: The central cluster's alias in MirrorMaker's configuration and in replicated topic names.
CENTRAL = "central"
HEAP_OPTIONS = ["-Xms64m", "-Xmx384m"]
JVM_OPTIONS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]

#: Replication settings shared by both flows: every internal topic with one replica (single
#: node clusters here; a deployment raises them), topics and groups looked for every few
#: seconds rather than every ten minutes, checkpoints, group offsets and heartbeats every
#: second, source offsets saved every 5 s (what a kill -9 re-sends at most).
#: MirrorMaker's connectors declare themselves in ServiceLoader manifests: reading those
#: replaces the reflective scan of every jar that Connect's default makes for the driver and
#: each herder (seconds each, tens of seconds on a busy host). Set at the top level for the
#: driver and per cluster for the herders, whose worker configuration takes its target's keys.
PLUGIN_DISCOVERY = "service_load"

REPLICATION_SETTINGS = {
    "plugin.discovery": PLUGIN_DISCOVERY,
    "replication.factor": "1",
    "checkpoints.topic.replication.factor": "1",
    "heartbeats.topic.replication.factor": "1",
    "offset-syncs.topic.replication.factor": "1",
    "offset.storage.replication.factor": "1",
    "config.storage.replication.factor": "1",
    "status.storage.replication.factor": "1",
    "refresh.topics.interval.seconds": "5",
    "refresh.groups.interval.seconds": "5",
    "emit.heartbeats.interval.seconds": "1",
    "emit.checkpoints.interval.seconds": "1",
    "sync.group.offsets.enabled": "true",
    "sync.group.offsets.interval.seconds": "1",
    # an offset sync whenever upstream and downstream offsets drift apart at all: the
    # translated offset of a group is then exact, not up to 100 records behind (the default)
    "offset.lag.max": "0",
    "offset.flush.interval.ms": "5000",
    # the sites' ACLs are the sites' own business: the centre grants its readers itself
    "sync.topic.acls.enabled": "false",
    "tasks.max": "1",
}

#: The broker's logging (to the console, which the process writes to its log file), warnings
#: only but MirrorMaker's own account of its flows.
LOG4J_CONFIG = (
    BROKER_LOG4J_CONFIG.format(level="WARN")
    + "logger.mirror.name = org.apache.kafka.connect.mirror\nlogger.mirror.level = INFO\n"
)


@dataclass(frozen=True)
class ClusterLink:
    """How MirrorMaker reaches one cluster: its alias, bootstrap servers and client settings
    (SASL etc., in the Java client's spelling)."""

    alias: str
    bootstrap_servers: str
    client: Mapping[str, str] | None = None

    @classmethod
    def of(cls, alias: str, settings: KafkaSettings) -> ClusterLink:
        """The link to the cluster ``settings`` connect to, logged in and verifying the
        brokers' certificates as they say (no client settings for a plaintext cluster)."""
        client = java_client_properties(settings)
        bootstrap = client.pop("bootstrap.servers")
        return cls(alias, bootstrap, client if settings.security_protocol != "PLAINTEXT" else None)


def remote_topic(site: str, topic: str) -> str:
    """The name of ``site``'s ``topic`` on the other cluster (MirrorMaker's default policy)."""
    return f"{site}.{topic}"


def mm2_properties(site: ClusterLink, central: ClusterLink, topics: TopicSettings) -> dict[str, str]:
    """MirrorMaker's configuration for one site's link to the centre."""
    up = "|".join(re.escape(name) for name in (topics.raw, topics.dlq, topics.replies))
    settings = {
        "clusters": f"{site.alias}, {central.alias}",
        f"{site.alias}->{central.alias}.enabled": "true",
        f"{site.alias}->{central.alias}.topics": up,
        f"{central.alias}->{site.alias}.enabled": "true",
        f"{central.alias}->{site.alias}.topics": re.escape(topics.commands),
        # the centre's consumer groups are not the site's to resume
        f"{central.alias}->{site.alias}.sync.group.offsets.enabled": "false",
        **REPLICATION_SETTINGS,
    }
    for cluster in (site, central):
        settings[f"{cluster.alias}.bootstrap.servers"] = cluster.bootstrap_servers
        settings[f"{cluster.alias}.plugin.discovery"] = PLUGIN_DISCOVERY
        for key, value in (cluster.client or {}).items():
            settings[f"{cluster.alias}.{key}"] = value
    return settings


def start_mirror_maker(
    folder: Path,
    site: ClusterLink,
    central: ClusterLink,
    topics: TopicSettings,
    central_settings: KafkaSettings,
    timeout_s: float,
) -> RunningService:
    """Start the site's MirrorMaker in ``folder`` and wait until its replicas of the raw and
    dead-letter topics exist at the centre (the flows run)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "mm2.properties"
    properties = mm2_properties(site, central, topics)
    config.write_text("".join(f"{key}={escape_property(value)}\n" for key, value in properties.items()))
    log4j = folder / "log4j2.properties"
    log4j.write_text(LOG4J_CONFIG)
    classpath = str(mirror_maker().jars()[0].parent / "*")
    command = [
        java_executable(),
        *HEAP_OPTIONS,
        *JVM_OPTIONS,
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        classpath,
        MAIN_CLASS,
        str(config),
    ]
    record = start_process(f"mirror-{site.alias}", command, folder / "mirror-maker.log", cwd=folder)
    return wait_for_mirror(site.alias, topics, central_settings, record, timeout_s)


def wait_for_mirror(
    site: str, topics: TopicSettings, central_settings: KafkaSettings, record: ProcessRecord, timeout_s: float
) -> RunningService:
    """Wait until the site's replicas exist at the centre and a heartbeat the site emitted
    after this process started has been copied there: the site's flow runs."""
    from iotwatch.application.stack.replication import HEARTBEATS_TOPIC, ReplicationLag

    wanted = [remote_topic(site, name) for name in (topics.raw, topics.dlq, topics.replies, HEARTBEATS_TOPIC)]
    wait_until(
        lambda: all(name in list_topics(central_settings, timeout_s=2.0) for name in wanted),
        timeout_s=timeout_s,
        what=f"MirrorMaker 2 of {site} (its replicas {', '.join(wanted)} at the centre)",
        record=record,
        interval_s=0.5,
    )
    started_ms = int(record.create_time * 1000)
    lag = ReplicationLag(central_settings, [site])
    try:
        wait_until(
            lambda: (lag.newest_heartbeat_ms(site) or 0) >= started_ms,
            timeout_s=timeout_s,
            what=f"MirrorMaker 2 of {site} (a fresh heartbeat of the site at the centre)",
            record=record,
            interval_s=0.5,
        )
    finally:
        lag.close()
    return RunningService(f"{site}-mirror", IMPLEMENTATION, f"{site}->{CENTRAL}", record)
