"""``iotwatch provision mqtt|tls|topics``: credentials, certificates and topics of a deployment.

Secrets are written to files with mode 0600 and never printed: the output names the files
and counts what changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from iotwatch.application.provision.mqtt_accounts import provision_fleet, read_fleet
from iotwatch.application.provision.tls import make_certificates
from iotwatch.cli import AppContext, emit, endpoint_options, json_option, pass_app

DEFAULT_FLEET_DIR = Path("deploy/mosquitto/fleet")
DEFAULT_TLS_DIR = Path("deploy/mosquitto/tls")


@click.group()
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
    show_default=True,
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
    show_default=True,
    help="Folder for ca.crt, ca.key, server.crt, server.key.",
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    default=("mosquitto", "localhost", "127.0.0.1"),
    show_default=True,
    help="Host name or IP address clients use to reach the broker (repeatable).",
)
@click.option(
    "--days", type=click.IntRange(min=1), default=825, show_default=True, help="Validity of the certificates."
)
@click.option("--new-ca", is_flag=True, help="Replace the CA too (devices must then trust the new ca.crt).")
@json_option
def tls(out_dir: Path, hosts: tuple[str, ...], days: int, new_ca: bool, as_json: bool) -> None:
    """A private CA and a server certificate for mosquitto's TLS listener (port 8883).

    Devices and services verify the broker with ca.crt (IOTWATCH_MQTT_TLS_CA_FILE, URL
    mqtts://HOST:8883). An existing CA is kept, so renewing the server certificate does
    not touch the devices.
    """
    emit(make_certificates(_checked(out_dir), list(hosts), days, new_ca=new_ca).summary(), as_json, _render_summary)


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


def _checked(out_dir: Path) -> Path:
    """The default folders are where docker-compose mounts them: refuse to scatter secrets
    into a folder compose will never read when run outside the repository root."""
    if out_dir in (DEFAULT_FLEET_DIR, DEFAULT_TLS_DIR) and not out_dir.parent.is_dir():
        raise click.UsageError(f"{out_dir.parent} does not exist here: run from the repository root or pass --out")
    return out_dir


def _render_summary(result: dict[str, Any]) -> None:
    for key, value in result.items():
        click.echo(f"{key}: {', '.join(map(str, value)) if isinstance(value, list) else value}")
