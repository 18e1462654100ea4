"""MirrorMaker 2 with least privilege: two clusters that authenticate with SCRAM and
authorize with ACLs (as docker-compose runs them), provisioned by ``iotwatch provision topics
--acls --site`` / ``--linked-site``, and MirrorMaker logged in on both as the ``mirror`` user.
Every flow works with the grants of :func:`iotwatch.application.provision.kafka_acls.mirror_grants` alone,
MirrorMaker logs no authorization error, and the services read the replicas with theirs."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from iotwatch.application.provision.kafka_acls import MIRROR_USER
from iotwatch.application.stack.kafka_broker import ADMIN_USER, SCRAM_MECHANISM, KafkaSecurity, start_kafka_broker
from iotwatch.application.stack.mirror_maker import CENTRAL, ClusterLink, remote_topic, start_mirror_maker
from iotwatch.application.stack.process import stop_process
from iotwatch.application.stack.service import RunningService
from iotwatch.clients.kafka import client_config, list_topics, produce_confirmed, read_to_end
from iotwatch.settings import KafkaSettings, TopicSettings
from tests.helpers import wait_for
from tests.integration.iotwatch.test_kafka_enforcement import iotwatch, user_settings

SITE = "site1"
USERS = (ADMIN_USER, "gateway", "stream", "responder", MIRROR_USER)


def scram_client(user: str, password: str) -> dict[str, str]:
    """MirrorMaker's client settings for ``user`` (the Java client's spelling)."""
    login = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": SCRAM_MECHANISM, "sasl.jaas.config": login}


#: client settings per user of one cluster
Users = dict[str, KafkaSettings]


@pytest.fixture(scope="module")
def linked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Users, Users, Path]]:
    """A site's cluster and the centre's, provisioned, and the site's MirrorMaker between them
    as ``mirror``: per cluster client settings per user, and MirrorMaker's log."""
    folder = tmp_path_factory.mktemp("mirror-acls")
    passwords = {user: secrets.token_urlsafe(12) for user in USERS}
    started: list[RunningService] = []
    try:
        for name in (SITE, CENTRAL):
            started.append(start_kafka_broker(folder / name, 90, security=KafkaSecurity(passwords)))
        site, centre = ({u: user_settings(b.endpoint, u, p) for u, p in passwords.items()} for b in started)
        for users, where in ((site, ("--site", SITE)), (centre, ("--linked-site", SITE))):
            provisioned = iotwatch(users[ADMIN_USER], "provision", "topics", "--acls", *where, "--json")
            assert provisioned.returncode == 0, provisioned.stderr
            assert json.loads(provisioned.stdout)["acls"] > 0
        wait_for(lambda: TopicSettings().raw in list_topics(site[MIRROR_USER]), 10, "the mirror user's ACLs")
        mirror = start_mirror_maker(
            folder / "mirror",
            ClusterLink(SITE, started[0].endpoint, scram_client(MIRROR_USER, passwords[MIRROR_USER])),
            ClusterLink(CENTRAL, started[1].endpoint, scram_client(MIRROR_USER, passwords[MIRROR_USER])),
            TopicSettings(),
            centre[ADMIN_USER],
            120,
        )
        started.append(mirror)
        yield site, centre, Path(mirror.process.log_file)
    finally:
        for service in reversed(started):
            stop_process(service.process)


def test_mirror_maker_links_the_clusters_with_the_mirror_users_grants_alone(
    linked: tuple[Users, Users, Path],
) -> None:
    site, centre, log = linked
    topics = TopicSettings()
    # readings up: the site's gateway writes, the centre's stream reads the replica
    gateway = Producer({**client_config(site["gateway"]), "enable.idempotence": True})
    for seq in range(20):
        produce_confirmed(site["gateway"], gateway, topics.raw, b"dev-1", f"reading {seq}".encode())
    # a consumer group at the site commits: MirrorMaker translates its offsets at the centre
    group = f"iotwatch-failover-{time.time_ns()}"
    consumer = Consumer(
        {
            **client_config(site["stream"]),
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topics.raw, p) for p in range(list_topics(site["stream"])[topics.raw])])
    read: list[object] = []
    deadline = time.monotonic() + 30
    while len(read) < 20 and time.monotonic() < deadline:
        read += [m for m in consumer.consume(100, 1) if m.error() is None]
    assert len(read) == 20
    consumer.commit(asynchronous=False)
    consumer.close()
    # commands down: the centre's responder writes, the site's relay (the responder's user) reads the replica
    responder = Producer({**client_config(centre["responder"]), "enable.idempotence": True})
    produce_confirmed(centre["responder"], responder, topics.commands, b"cmd-1", b'{"command": 1}')
    # replies up: the site's relay writes, the centre's responder reads the replica
    relay = Producer({**client_config(site["responder"]), "enable.idempotence": True})
    produce_confirmed(site["responder"], relay, topics.replies, b"iot/s/t/d/commands/ack", b'{"reply": 1}')

    def values(kafka: KafkaSettings, topic: str) -> list[bytes]:
        return [m.value() for m in read_to_end(kafka, topic, 10)] if topic in list_topics(kafka) else []

    replica = remote_topic(SITE, topics.raw)
    wait_for(lambda: len(values(centre["stream"], replica)) >= 20, 60, "the readings at the centre, read by stream")
    wait_for(lambda: values(site["responder"], topics.commands_replica) == [b'{"command": 1}'], 60, "the command")
    wait_for(
        lambda: values(centre["responder"], remote_topic(SITE, topics.replies)) == [b'{"reply": 1}'], 60, "the reply"
    )

    def translated() -> int:
        probe = Consumer({**client_config(centre[ADMIN_USER]), "group.id": group, "enable.auto.commit": False})
        try:
            found = probe.committed(
                [TopicPartition(replica, p) for p in range(list_topics(centre[ADMIN_USER])[replica])], 10
            )
        finally:
            probe.close()
        return sum(max(tp.offset, 0) for tp in found)

    wait_for(lambda: translated() == 20, 60, "the group's translated offsets at the centre")
    refused = [
        line
        for line in log.read_text().splitlines()
        if "AuthorizationException" in line or "not authorized" in line.lower()
    ]
    assert not refused, "MirrorMaker was refused:\n" + "\n".join(refused[:20])
