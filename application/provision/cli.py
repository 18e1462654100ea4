"""``iotwatch provision mqtt|tls|topics``: credentials, certificates and topics of a deployment.

Secrets are written to files with mode 0600 and never printed: the output names the files
and counts what changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from iotwatch.application.provision.mqtt_accounts import provision_fleet, read_fleet
from iotwatch.certificates import make_certificates, make_kafka_keystore
from iotwatch.cli import AppContext, emit, endpoint_options, json_option, pass_app

DEFAULT_FLEET_DIR = Path("deploy/mosquitto/fleet")
DEFAULT_TLS_DIR = Path("deploy/mosquitto/tls")
DEFAULT_KAFKA_TLS_DIR = Path("deploy/kafka/tls")
#: The compose Kafka broker and the names its clients reach it by: ``kafka`` on the compose
#: network (the sites' MirrorMaker), ``localhost`` and 127.0.0.1 through the published port.
DEFAULT_KAFKA_BROKERS = ("kafka=kafka,localhost,127.0.0.1",)


@click.group(context_settings={"show_default": True})
def provision() -> None:
    """Provision MQTT device accounts, TLS certificates and Kafka topics for docker-compose."""


@provision.command()
@click.option(
    "--fleet",
    "fleet_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="CSV file with the header site,device_type,device_id, one device a line.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_FLEET_DIR,
    help="Folder for passwd, acl and devices/<device_id>.json "
    "(the compose mosquitto service reads deploy/mosquitto/fleet).",
)
@click.option("--rotate", is_flag=True, help="New passwords for every device (default: existing ones are kept).")
@json_option
def mqtt(fleet_file: Path, out_dir: Path, rotate: bool, as_json: bool) -> None:
    """One MQTT account per device, each limited to its own topics.

    Writes a mosquitto password file (PBKDF2-SHA512), an ACL (a device publishes only its
    telemetry, status and command replies, and subscribes only to its own command topic)
    and a credentials file per device to install on it. Run again after changing the fleet
    file, then restart mosquitto (docker-compose restart mosquitto).
    """
    result = provision_fleet(read_fleet(fleet_file), _checked(out_dir), rotate=rotate)
    emit(result.summary(), as_json, _render_summary)


@provision.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_TLS_DIR,
    help="Folder for ca.crt, ca.key, server.crt, server.key.",
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    default=("mosquitto", "localhost", "127.0.0.1"),
    help="Host name or IP address clients use to reach the broker (repeatable).",
)
@click.option("--days", type=click.IntRange(min=1), default=825, help="Validity of the certificates.")
@click.option("--new-ca", is_flag=True, help="Replace the CA too (devices must then trust the new ca.crt).")
@click.option(
    "--kafka",
    "kafka_brokers",
    multiple=True,
    default=DEFAULT_KAFKA_BROKERS,
    metavar="BROKER=HOST[,HOST...]",
    help="A Kafka broker and every name or address its clients reach it by (repeatable): its "
    "keystore BROKER.p12 is signed by the same CA. Add the host of KAFKA_EXTERNAL_HOST.",
)
@click.option(
    "--kafka-out",
    "kafka_out",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_KAFKA_TLS_DIR,
    help="Folder for the brokers' keystores (BROKER.p12, BROKER.p12.password) and a copy of ca.crt.",
)
@json_option
def tls(
    out_dir: Path,
    hosts: tuple[str, ...],
    days: int,
    new_ca: bool,
    kafka_brokers: tuple[str, ...],
    kafka_out: Path,
    as_json: bool,
) -> None:
    """A private CA, a server certificate for mosquitto's TLS listener (port 8883) and a
    keystore per Kafka broker for its TLS listener (EXTERNAL, SASL_SSL).

    Devices and services verify the MQTT broker with ca.crt (IOTWATCH_MQTT_TLS_CA_FILE, URL
    mqtts://HOST:8883) and the Kafka brokers with the same file (IOTWATCH_KAFKA_SSL_CA_LOCATION).
    An existing CA is kept, so renewing the servers' certificates does not touch the clients;
    a broker's keystore keeps its password, so its configuration does not change either.
    """
    brokers = [_broker(spec) for spec in kafka_brokers]
    out_dir, kafka_out = _checked(out_dir), _checked(kafka_out, "--kafka-out")  # both before anything is written
    summary = make_certificates(out_dir, list(hosts), days, new_ca=new_ca).summary()
    keystores = [make_kafka_keystore(kafka_out, out_dir, name, names, days) for name, names in brokers]
    emit({**summary, "kafka": [keystore.summary() for keystore in keystores]}, as_json, _render_tls)


def _render_tls(result: dict[str, Any]) -> None:
    _render_summary({key: value for key, value in result.items() if key != "kafka"})
    for keystore in result["kafka"]:
        click.echo(
            f"kafka broker {keystore['broker']} ({', '.join(keystore['hosts'])}): {keystore['keystore']}, "
            f"password in {keystore['keystore_password_file']}"
        )


def _broker(spec: str) -> tuple[str, list[str]]:
    """``BROKER=HOST[,HOST...]`` as the broker's name and its hosts."""
    name, sep, hosts = spec.partition("=")
    if not sep or not name or not hosts:
        raise click.BadParameter(f"{spec!r} is not BROKER=HOST[,HOST...]", param_hint="--kafka")
    return name.strip(), [host.strip() for host in hosts.split(",")]


@provision.command()
@endpoint_options(kafka=True)
@click.option(
    "--acls",
    is_flag=True,
    help="Also grant each compose service user (gateway, stream, responder) "
    "its least-privilege ACLs (a broker with an authorizer; as admin).",
)
@click.option(
    "--site",
    metavar="NAME",
    help="This is the cluster of the edge site NAME (sites, docs/sites.md): also its replies topic, and "
    "with --acls the relay's and MirrorMaker 2's (user mirror) grants here.",
)
@click.option(
    "--linked-site",
    "linked_sites",
    metavar="NAME",
    multiple=True,
    help="This is the central cluster and site NAME is linked to it (repeatable): with --acls, the "
    "readers of NAME's replicas and MirrorMaker 2's (user mirror) grants here.",
)
@json_option
@pass_app
def topics(app: AppContext, acls: bool, site: str | None, linked_sites: tuple[str, ...], as_json: bool) -> None:
    """Create the pipeline's Kafka topics, the on-call ones compacted (for brokers with
    auto-creation off), and with --acls the services' ACLs."""
    from iotwatch.clients.kafka import ensure_pipeline_topics, ensure_topics

    if site and linked_sites:
        raise click.UsageError("--site (an edge site's cluster) and --linked-site (the centre's) exclude each other")
    settings = app.settings
    wanted = settings.topics.kafka_topics() + settings.topics.compacted_topics()
    created = ensure_pipeline_topics(settings.kafka, settings.topics)
    if site:
        wanted.append(settings.topics.replies)
        created += ensure_topics(settings.kafka, [settings.topics.replies])
    summary: dict[str, Any] = {
        "topics": wanted,
        "created": created,
        "partitions": settings.kafka.partitions,
        "replication_factor": settings.kafka.replication_factor,
    }
    if acls:
        from iotwatch.application.provision.kafka_acls import apply_grants, mirror_grants, service_grants

        grants = service_grants(settings.topics, list(linked_sites), at_site=bool(site))
        if site or linked_sites:
            grants += mirror_grants(settings.topics, list(linked_sites), site)
        summary["acls"] = apply_grants(settings.kafka, grants)
    emit(summary, as_json, _render_summary)


def _checked(out_dir: Path, option: str = "--out") -> Path:
    """The default folders are where docker-compose mounts them: refuse to scatter secrets
    into a folder compose will never read when run outside the repository root."""
    if out_dir in (DEFAULT_FLEET_DIR, DEFAULT_TLS_DIR, DEFAULT_KAFKA_TLS_DIR) and not out_dir.parent.is_dir():
        raise click.UsageError(f"{out_dir.parent} does not exist here: run from the repository root or pass {option}")
    return out_dir


def _render_summary(result: dict[str, Any]) -> None:
    for key, value in result.items():
        click.echo(f"{key}: {', '.join(map(str, value)) if isinstance(value, list) else value}")
