"""Least-privilege Kafka ACLs for the compose deployment's SCRAM users, as one table
(docs/internals.md, "Kafka ACLs")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from iotwatch.application.stack.mirror_maker import CENTRAL, remote_topic
from iotwatch.clients.kafka import admin_client
from iotwatch.errors import ServiceUnavailable
from iotwatch.settings import KafkaSettings, TopicSettings

Operation = Literal["read", "write", "create", "describe", "describe_configs", "alter", "alter_configs"]
#: MirrorMaker 2's user (docker-compose.yml, profile "sites"), on the site's cluster and the centre's.
MIRROR_USER = "mirror"


@dataclass(frozen=True)
class Grant:
    """ALLOW ``operation`` on a topic, consumer group or the cluster (a literal name or a
    prefix; ``*`` every one) to ``user``."""

    user: str
    resource: Literal["topic", "group", "cluster"]
    name: str
    operation: Operation
    prefixed: bool = False


#: Consumer-group name prefixes the services' clients use. They assign partitions and commit
#: nothing, so they join no group; READ is granted anyway, so a future commit does not fail.
GROUP_PREFIXES = {"stream": ("iotwatch-", "spark-kafka-source"), "responder": ("iotwatch-",)}


def service_grants(topics: TopicSettings, sites: list[str] | None = None, *, at_site: bool = False) -> list[Grant]:
    """Every grant of the compose deployment's service users (``admin`` needs none): on the
    centre's cluster, with ``sites`` its readers of those sites' replicas; ``at_site``: on a
    site's cluster, where the responder's user is the relay's."""
    access: dict[str, dict[Operation, list[str]]] = {
        "gateway": {"read": [], "write": [topics.raw, topics.dlq]},
        "stream": {
            "read": [topics.raw, topics.model_updates, *(remote_topic(site, topics.raw) for site in sites or [])],
            "write": [topics.alerts, topics.dlq],
        },
        "responder": {
            "read": [
                topics.alerts,
                topics.commands,
                topics.emergencies,
                *(remote_topic(site, topics.replies) for site in sites or []),
            ],
            "write": [topics.commands, topics.alerts, topics.dlq, topics.device_twin, topics.emergencies],
        },
    }
    if at_site:
        access["responder"]["read"].append(topics.commands_replica)
        access["responder"]["write"].append(topics.replies)
    grants = [
        Grant(user, "topic", topic, operation)
        for user, by_operation in access.items()
        for operation, names in by_operation.items()
        for topic in names
    ]
    grants += [
        Grant(user, "group", prefix, "read", prefixed=True)
        for user, prefixes in GROUP_PREFIXES.items()
        for prefix in prefixes
    ]
    return grants


def mirror_grants(topics: TopicSettings, sites: list[str], site: str | None = None) -> list[Grant]:
    """MirrorMaker 2's grants on the centre's cluster, linked to ``sites``, or on ``site``'s:
    each cluster is the source of one flow and the target of the other (docs/sites.md lists
    the grants and says why each is needed)."""
    central = site is None
    copied = [topics.commands] if central else [topics.raw, topics.dlq, topics.replies]
    others = list(sites) if central else [CENTRAL]
    on_groups: Operation = "read" if central else "describe"
    replica_operations: list[Operation] = ["create", "read", "write", "alter", "alter_configs"]
    grants = [Grant(MIRROR_USER, "cluster", "kafka-cluster", "describe")]
    grants += [Grant(MIRROR_USER, "topic", name, op) for name in copied for op in ("read", "describe_configs")]
    grants += [
        Grant(MIRROR_USER, "topic", f"{other}.", op, prefixed=True) for other in others for op in replica_operations
    ]
    for name, prefixed in (("mm2-", True), ("heartbeats", False)):
        grants += [
            Grant(MIRROR_USER, "topic", name, op, prefixed=prefixed)
            for op in ("create", "read", "write", "describe_configs")
        ]
    grants.append(Grant(MIRROR_USER, "group", "*", on_groups))
    grants += [Grant(MIRROR_USER, "group", f"{other}-mm2", "read") for other in others]
    return grants


def acl_bindings(grants: list[Grant]) -> list[Any]:
    """The confluent-kafka ``AclBinding`` of each grant (any host)."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    resources = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP, "cluster": ResourceType.BROKER}
    return [
        AclBinding(
            resources[grant.resource],
            grant.name,
            ResourcePatternType.PREFIXED if grant.prefixed else ResourcePatternType.LITERAL,
            f"User:{grant.user}",
            "*",
            AclOperation[grant.operation.upper()],
            AclPermissionType.ALLOW,
        )
        for grant in grants
    ]


def apply_grants(settings: KafkaSettings, grants: list[Grant], timeout_s: float = 15.0) -> int:
    """Create the ACLs of ``grants`` (creating an existing one is a no-op); returns how many.
    Needs a broker with an authorizer, and an admin user."""
    from confluent_kafka import KafkaException

    bindings = acl_bindings(grants)
    admin = admin_client(settings)  # keep a reference: the futures die with their client
    for binding, future in admin.create_acls(bindings, request_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            raise ServiceUnavailable(f"cannot create the Kafka ACL {binding}: {exc}") from exc
    return len(bindings)
