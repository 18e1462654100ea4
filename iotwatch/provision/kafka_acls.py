"""Least-privilege Kafka ACLs for the compose deployment's SCRAM users.

The broker runs an authorizer with ``admin`` as the only super user (docker-compose.yml),
so a user with no ACL can do nothing. Each service gets what its code does, no more:

- ``gateway`` writes readings and dead letters;
- ``stream`` reads readings and model updates, writes alerts and dead letters;
- ``responder`` reads alerts, its command log and its emergency records; writes commands,
  alerts (escalations), dead letters, device twins (what devices report) and emergency
  records.

No service may create, delete or reconfigure topics (``admin`` made them) or write a topic
it has no business in: a compromised gateway cannot forge alerts, which become pages.
READ or WRITE on a topic implies DESCRIBE, which is all the services' start-up topic check
needs. Consumers assign partitions and commit nothing, so they join no group; READ on the
groups their clients name (by prefix) is granted anyway, so a future commit does not fail.
Why a table in code rather than in compose: the topic names come from the settings, the
same ones the services read, and a test checks the table against the services' users.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from iotwatch.clients.kafka import admin_client
from iotwatch.errors import ServiceUnavailable
from iotwatch.settings import KafkaSettings, TopicSettings

Operation = Literal["read", "write"]


@dataclass(frozen=True)
class Grant:
    """ALLOW ``operation`` on a topic or consumer group (a literal name or a prefix) to ``user``."""

    user: str
    resource: Literal["topic", "group"]
    name: str
    operation: Operation
    prefixed: bool = False


#: Consumer-group name prefixes the services' clients use (never joined; see the docstring).
GROUP_PREFIXES = {"stream": ("iotwatch-", "spark-kafka-source"), "responder": ("iotwatch-",)}


def service_grants(topics: TopicSettings) -> list[Grant]:
    """Every grant of the compose deployment's service users (``admin`` needs none)."""
    access: dict[str, dict[Operation, list[str]]] = {
        "gateway": {"read": [], "write": [topics.raw, topics.dlq]},
        "stream": {"read": [topics.raw, topics.model_updates], "write": [topics.alerts, topics.dlq]},
        "responder": {
            "read": [topics.alerts, topics.commands, topics.emergencies],
            "write": [topics.commands, topics.alerts, topics.dlq, topics.device_twin, topics.emergencies],
        },
    }
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


def acl_bindings(grants: list[Grant]) -> list[Any]:
    """The confluent-kafka ``AclBinding`` of each grant (any host)."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    return [
        AclBinding(
            ResourceType.TOPIC if grant.resource == "topic" else ResourceType.GROUP,
            grant.name,
            ResourcePatternType.PREFIXED if grant.prefixed else ResourcePatternType.LITERAL,
            f"User:{grant.user}",
            "*",
            AclOperation.READ if grant.operation == "read" else AclOperation.WRITE,
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
