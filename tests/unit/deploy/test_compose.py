"""Static checks of the docker-compose deployment; no Docker engine needed.

``docker-compose config`` validates and interpolates docker-compose.yml with the values
of .env.example (skipped without docker-compose, except in CI where it fails); the other
tests parse the files directly and check that they agree with each other and with
iotwatch/settings.py: mounted and built paths exist, IOTWATCH_* names are real settings,
every ${VAR} is documented in .env.example, Grafana queries with InfluxQL, mosquitto
refuses anonymous clients, InfluxDB gets its DBRP mapping.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic_settings import BaseSettings

from iotwatch import settings as settings_module
from tests.conftest import REPO_ROOT

REPO = REPO_ROOT
COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
IN_CI = os.environ.get("CI") == "true"

# ${VAR}, ${VAR:-default}, ${VAR:?error} and $VAR, after "$$" (a literal "$") is removed.
_VAR_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)|\$([A-Za-z_][A-Za-z0-9_]*)")
_IOTWATCH_NAME = re.compile(r"\bIOTWATCH_[A-Z0-9_]+\b")


# --- helpers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose_text() -> str:
    return COMPOSE_FILE.read_text()


@pytest.fixture(scope="module")
def compose(compose_text: str) -> dict[str, Any]:
    data = yaml.safe_load(compose_text)
    assert isinstance(data, dict) and data.get("services"), "docker-compose.yml has no services"
    return data


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    values: dict[str, str] = {}
    for number, line in enumerate(ENV_EXAMPLE.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), f".env.example:{number}: not KEY=VALUE: {line!r}"
        assert key not in values, f".env.example:{number}: {key} listed twice"
        values[key] = value
    return values


def referenced_variables(text: str) -> set[str]:
    """Variables compose interpolates in ``text`` (``$$`` escapes are not references)."""
    text = "\n".join(line for line in text.replace("$$", "").splitlines() if not line.lstrip().startswith("#"))
    return {braced or bare for braced, bare in _VAR_REFERENCE.findall(text)}


def environment_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def bind_mounts(service: dict[str, Any]) -> list[tuple[Path, str]]:
    """(host path, container path) of every bind mount of a service."""
    mounts = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            if volume.get("type") != "bind":
                continue
            source, target = volume["source"], volume["target"]
        else:
            source, _, rest = volume.partition(":")
            target = rest.split(":", 1)[0]
            if not source.startswith((".", "/", "~")):
                continue  # a named volume
        mounts.append(((REPO / os.path.expanduser(source)).resolve(), target))
    return mounts


def host_path(service: dict[str, Any], container_path: str) -> Path | None:
    """The repository file behind ``container_path`` of a service, through its bind mounts."""
    wanted = PurePosixPath(container_path)
    for source, target in bind_mounts(service):
        target_path = PurePosixPath(target)
        if wanted == target_path:
            return source
        if target_path in wanted.parents:
            return source / wanted.relative_to(target_path)
    return None


def valid_iotwatch_env_names() -> set[str]:
    """IOTWATCH_* names iotwatch reads: env_prefix + FIELD of each settings class."""
    names = {settings_module.CONFIG_FILE_ENV}
    for obj in vars(settings_module).values():
        if not (isinstance(obj, type) and issubclass(obj, BaseSettings)):
            continue
        prefix = obj.model_config.get("env_prefix") or ""
        if not prefix.startswith("IOTWATCH_"):
            continue
        for field_name, field in obj.model_fields.items():
            names.add(f"{prefix}{field_name}".upper())
            if isinstance(field.validation_alias, str):
                names.add(field.validation_alias.upper())
    return names


def services_built_here(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items() if "build" in svc}


def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return [docker, "compose"]
    return None


# --- docker-compose itself -------------------------------------------------------------


def test_compose_config_renders_with_env_example(env_example: dict[str, str]) -> None:
    command = compose_command()
    if command is None:
        message = "neither docker-compose nor the docker compose plugin is installed"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    # The values must come from .env.example, not from the developer's shell.
    env = {k: v for k, v in os.environ.items() if k not in env_example and not k.startswith("COMPOSE_")}
    result = subprocess.run(
        [*command, "--env-file", str(ENV_EXAMPLE), "-f", str(COMPOSE_FILE), "config"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"compose config failed:\n{result.stderr}"
    rendered = yaml.safe_load(result.stdout)
    assert set(rendered["services"]) >= {"mosquitto", "kafka", "influxdb", "grafana", "gateway", "stream", "simulator"}
    gateway_env = environment_of(rendered["services"]["gateway"])
    assert gateway_env["IOTWATCH_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert gateway_env["IOTWATCH_INFLUX_PASSWORD"] == env_example["INFLUXDB_WRITER_PASSWORD"]
    # The admin token stays with the influxdb service (least privilege).
    for name, service in rendered["services"].items():
        if name != "influxdb":
            assert env_example["INFLUXDB_ADMIN_TOKEN"] not in environment_of(service).values(), name


# --- paths -----------------------------------------------------------------------------


def test_mounted_and_built_paths_exist(compose: dict[str, Any]) -> None:
    missing = []
    for name, service in compose["services"].items():
        for source, target in bind_mounts(service):
            if not source.exists():
                missing.append(f"{name}: {source.relative_to(REPO)} (mounted at {target})")
        build = service.get("build")
        if build is not None:
            context = REPO / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = context / ("Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile"))
            if not context.is_dir():
                missing.append(f"{name}: build context {context}")
            if not dockerfile.is_file():
                missing.append(f"{name}: {dockerfile}")
    assert not missing, "missing: " + "; ".join(missing)


def test_dockerfile_copy_sources_exist(compose: dict[str, Any]) -> None:
    dockerfiles = {
        REPO / svc["build"].get("context", ".") / svc["build"].get("dockerfile", "Dockerfile")
        for svc in services_built_here(compose).values()
    }
    assert dockerfiles, "no service is built from a Dockerfile"
    for dockerfile in dockerfiles:
        for line in dockerfile.read_text().splitlines():
            parts = line.split()
            if not parts or parts[0].upper() not in ("COPY", "ADD") or any(p.startswith("--from") for p in parts):
                continue
            sources = [p for p in parts[1:-1] if not p.startswith("--")]
            for source in sources:
                assert (dockerfile.parent / source).exists(), f"{dockerfile.name}: {line.strip()!r}: {source} missing"


def test_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for volume in service.get("volumes") or []:
            source = volume.get("source") if isinstance(volume, dict) else volume.split(":", 1)[0]
            if source and not source.startswith((".", "/", "~")):
                assert source in declared, f"{name}: named volume {source} is not declared under volumes:"


def test_services_that_keep_state_keep_it_in_a_volume(compose: dict[str, Any]) -> None:
    """The commands keep their state under ~/.iotwatch (settings' defaults): the image's home
    is its working directory, and the services with state mount a named volume there, so a
    re-created container resumes (checkpoints, archive, device seqs)."""
    dockerfile = (REPO / "Dockerfile").read_text()
    home = re.search(r"^ENV HOME=(\S+)$", dockerfile, re.MULTILINE)
    assert home and f"--home-dir {home[1]}" in dockerfile and f"WORKDIR {home[1]}" in dockerfile
    stateful = {"stream", "archive-compactor", "simulator", "site1-simulator"}
    for name in stateful:
        targets = {v.split(":")[1] for v in compose["services"][name].get("volumes", []) if isinstance(v, str)}
        assert home[1] in targets, f"{name} keeps state under {home[1]} without a volume there"


# --- variables -------------------------------------------------------------------------


def test_iotwatch_env_names_are_real_settings(compose: dict[str, Any], compose_text: str) -> None:
    valid = valid_iotwatch_env_names()
    used = set(_IOTWATCH_NAME.findall(compose_text))
    for service in compose["services"].values():
        used |= {key for key in environment_of(service) if key.startswith("IOTWATCH_")}
    assert used, "docker-compose.yml configures no iotwatch setting"
    unknown = sorted(used - valid)
    assert not unknown, f"not iotwatch settings (see iotwatch/settings.py): {unknown}"


def test_iotwatch_services_point_at_compose_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    expected = {
        "gateway": {
            "IOTWATCH_MQTT_URL",
            "IOTWATCH_MQTT_USERNAME",
            "IOTWATCH_MQTT_PASSWORD",
            "IOTWATCH_KAFKA_BOOTSTRAP_SERVERS",
            "IOTWATCH_INFLUX_URL",
            "IOTWATCH_INFLUX_USERNAME",
            "IOTWATCH_INFLUX_PASSWORD",
            "IOTWATCH_INFLUX_DATABASE",
        },
        "stream": {
            "IOTWATCH_KAFKA_BOOTSTRAP_SERVERS",
            "IOTWATCH_INFLUX_URL",
            "IOTWATCH_INFLUX_USERNAME",
            "IOTWATCH_INFLUX_PASSWORD",
            "IOTWATCH_INFLUX_DATABASE",
        },
        "simulator": {"IOTWATCH_MQTT_URL", "IOTWATCH_MQTT_USERNAME", "IOTWATCH_MQTT_PASSWORD"},
        "responder": {
            "IOTWATCH_MQTT_URL",
            "IOTWATCH_MQTT_USERNAME",
            "IOTWATCH_MQTT_PASSWORD",
            "IOTWATCH_KAFKA_BOOTSTRAP_SERVERS",
        },
    }
    for name, keys in expected.items():
        env = environment_of(services[name])
        assert keys <= set(env), f"{name} lacks {sorted(keys - set(env))}"
        for key, value in env.items():
            if key.endswith("_URL") and value:
                host = urlsplit(value).hostname
            elif key == "IOTWATCH_KAFKA_BOOTSTRAP_SERVERS":
                host = value.split(",")[0].rsplit(":", 1)[0]
            else:
                continue
            assert host in services, f"{name}: {key}={value} names no compose service"


def test_iotwatch_services_refuse_placeholder_secrets(compose: dict[str, Any]) -> None:
    """tests/unit/deploy/test_secrets.py shows what the setting does; here, that compose sets it."""
    for name, service in services_built_here(compose).items():
        assert environment_of(service).get("IOTWATCH_DEPLOYMENT_REQUIRE_SECRETS") == "true", name


def test_compose_variables_are_listed_in_env_example(compose_text: str, env_example: dict[str, str]) -> None:
    referenced = referenced_variables(compose_text)
    assert referenced, "docker-compose.yml references no variables"
    undocumented = sorted(referenced - set(env_example))
    assert not undocumented, f"referenced in docker-compose.yml but missing from .env.example: {undocumented}"
    unused = sorted(set(env_example) - referenced)
    assert not unused, f"listed in .env.example but not used by docker-compose.yml: {unused}"


def test_env_example_holds_placeholders_only(env_example: dict[str, str]) -> None:
    for key, value in env_example.items():
        if re.search(r"PASSWORD|TOKEN|SECRET", key):
            assert "CHANGE_ME" in value, f".env.example: {key} must be a CHANGE_ME placeholder"
    assert ".env" in (REPO / ".gitignore").read_text().split(), ".env must be git-ignored"
    assert ".env" in (REPO / ".dockerignore").read_text().split(), ".env must stay out of the image"


def test_secrets_come_from_the_environment(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for key, value in environment_of(service).items():
            if re.search(r"PASSWORD|TOKEN", key):
                assert value.startswith("${") and ":?" in value, (
                    f"{name}: {key} must be a required variable (${{VAR:?...}}), not {value!r}"
                )


def test_healthy_conditions_have_healthchecks(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        if isinstance(depends, list):
            continue
        for target, spec in depends.items():
            assert target in services, f"{name} depends on unknown service {target}"
            if (spec or {}).get("condition") == "service_healthy":
                assert services[target].get("healthcheck"), f"{name} waits for {target}, which has no healthcheck"


def test_iotwatch_services_share_one_image(compose: dict[str, Any]) -> None:
    built = services_built_here(compose)
    # the "sites" profile
    site = {"site1-gateway", "site1-simulator", "site1-kafka-topics", "site1-central-kafka-topics", "site1-relay"}
    assert set(built) == {"gateway", "stream", "archive-compactor", "simulator", "kafka-topics", "responder"} | site
    assert len({svc.get("image") for svc in built.values()}) == 1
    commands = {
        name: svc["command"] if isinstance(svc["command"], list) else shlex.split(svc["command"])
        for name, svc in built.items()
    }
    assert "gateway" in commands["gateway"]
    assert commands["stream"][-1] == "stream"
    assert "simulate" in commands["simulator"]
    assert "respond" in commands["responder"]
    assert commands["archive-compactor"][-5:] == ["archive", "compact", "--every", "3600", "--json"]
    assert commands["kafka-topics"][-3:] == ["provision", "topics", "--acls"]
    assert commands["site1-kafka-topics"] == [*commands["kafka-topics"], "--site", "site1"]
    assert commands["site1-central-kafka-topics"] == [*commands["kafka-topics"], "--linked-site", "site1"]
    assert "--id-prefix" in commands["site1-simulator"]


# --- Kafka ---------------------------------------------------------------------------------


def test_every_kafka_client_authenticates_with_scram(compose: dict[str, Any]) -> None:
    services = compose["services"]
    kafka_env = environment_of(services["kafka"])
    assert kafka_env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    protocols = dict(item.split(":") for item in kafka_env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = dict(item.split("://") for item in kafka_env["KAFKA_LISTENERS"].split(","))
    for name, protocol in protocols.items():
        # The only unauthenticated listener is KRaft's controller, reachable from loopback only.
        assert protocol.startswith("SASL_") or (name == "CONTROLLER" and listeners[name].startswith("localhost:")), name
    assert kafka_env["KAFKA_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    entrypoint = host_path(services["kafka"], services["kafka"]["entrypoint"][-1])
    assert entrypoint is not None and entrypoint.is_file(), "the kafka entry point is not mounted"
    scram_users = set(re.findall(r"SCRAM-SHA-512=\[name=([a-z]+),", entrypoint.read_text()))
    clients = {
        name: environment_of(svc)
        for name, svc in services.items()
        if "IOTWATCH_KAFKA_BOOTSTRAP_SERVERS" in environment_of(svc)
    }
    assert {"gateway", "stream", "kafka-topics"} <= set(clients)
    for name, env in clients.items():
        assert env["IOTWATCH_KAFKA_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT", name
        assert env["IOTWATCH_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512", name
        assert env["IOTWATCH_KAFKA_SASL_USERNAME"] in scram_users, f"{name}: no such SCRAM user"
    # On each cluster (the centre, a site), each service its own user; only the init steps are admin.
    for cluster in {env["IOTWATCH_KAFKA_BOOTSTRAP_SERVERS"] for env in clients.values()}:
        users = {
            name: env["IOTWATCH_KAFKA_SASL_USERNAME"]
            for name, env in clients.items()
            if env["IOTWATCH_KAFKA_BOOTSTRAP_SERVERS"] == cluster
        }
        services_users = [user for name, user in users.items() if not name.endswith("kafka-topics")]
        assert len(set(services_users)) == len(services_users), users
        assert [name for name, user in users.items() if user == "admin"] == [
            name for name in users if name.endswith("kafka-topics")
        ], users
    for name in ("gateway", "stream"):
        assert services[name]["depends_on"]["kafka-topics"]["condition"] == "service_completed_successfully"


def test_kafka_listeners_that_leave_the_compose_network_speak_tls(compose: dict[str, Any]) -> None:
    """The published listeners (EXTERNAL for clients off the network, REPLICATION for the
    sites' MirrorMakers) are SASL_SSL; INTERNAL stays on the compose network; the entry point
    gives an SSL listener the keystore of `iotwatch provision tls`."""
    kafka = compose["services"]["kafka"]
    env = environment_of(kafka)
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert protocols == {
        "INTERNAL": "SASL_PLAINTEXT",
        "CONTROLLER": "PLAINTEXT",
        "EXTERNAL": "SASL_SSL",
        "REPLICATION": "SASL_SSL",
    }
    published = [port.rsplit(":", 1)[1] for port in kafka["ports"]]
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    assert {name for name, address in listeners.items() if address.rsplit(":", 1)[1] in published} == {
        "EXTERNAL",
        "REPLICATION",
    }
    entrypoint = host_path(kafka, kafka["entrypoint"][-1])
    assert entrypoint is not None
    script = entrypoint.read_text()
    assert 'KAFKA_SSL_KEYSTORE_LOCATION="$TLS_DIR/kafka.p12"' in script
    assert host_path(kafka, "/iotwatch/kafka/tls/kafka.p12") == REPO / "deploy/kafka/tls/kafka.p12"
    # a site's broker is reached on the site's network only: no TLS listener there
    site = environment_of(compose["services"]["site1-kafka"])
    assert "SSL" not in site["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]


def test_kafka_gives_each_service_user_least_privilege(compose: dict[str, Any]) -> None:
    """An authorizer denies by default, admin is the only SASL super user, and the ACLs the
    init step grants (application/provision/kafka_acls.py) give each service only the topics
    its code uses: above all, only the stream and the responder write alerts (pages)."""
    from iotwatch.application.provision.kafka_acls import GROUP_PREFIXES, acl_bindings, service_grants
    from iotwatch.settings import TopicSettings

    services = compose["services"]
    kafka_env = environment_of(services["kafka"])
    assert kafka_env["KAFKA_AUTHORIZER_CLASS_NAME"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert kafka_env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert set(kafka_env["KAFKA_SUPER_USERS"].split(";")) == {"User:admin", "User:ANONYMOUS"}
    # ANONYMOUS is only who connects to the unauthenticated listener, reachable from loopback only.
    protocols = dict(item.split(":") for item in kafka_env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = dict(item.split("://") for item in kafka_env["KAFKA_LISTENERS"].split(","))
    assert all(
        listeners[name].startswith("localhost:")
        for name, protocol in protocols.items()
        if not protocol.startswith("SASL_")
    )
    users = {
        name: environment_of(svc)["IOTWATCH_KAFKA_SASL_USERNAME"]
        for name, svc in services.items()
        if "IOTWATCH_KAFKA_SASL_USERNAME" in environment_of(svc)
    }
    assert users == {
        "kafka-topics": "admin",
        "gateway": "gateway",
        "stream": "stream",
        "responder": "responder",
        # a site's cluster: its init step, its gateway and its relay (the responder's stage);
        # the centre's side of the site's link: an init step
        "site1-kafka-topics": "admin",
        "site1-central-kafka-topics": "admin",
        "site1-gateway": "gateway",
        "site1-relay": "responder",
    }

    topics = TopicSettings()
    grants = service_grants(topics)
    assert {grant.user for grant in grants} == set(users.values()) - {"admin"}
    assert {grant.operation for grant in grants} == {"read", "write"}  # never create, alter, delete or cluster
    topic_grants = [grant for grant in grants if grant.resource == "topic"]
    assert not any(grant.prefixed or grant.name in ("*", "") for grant in topic_grants)

    def allowed(user: str, operation: str) -> set[str]:
        return {g.name for g in topic_grants if g.user == user and g.operation == operation}

    assert (allowed("gateway", "read"), allowed("gateway", "write")) == (set(), {topics.raw, topics.dlq})
    assert allowed("stream", "read") == {topics.raw, topics.model_updates}
    assert allowed("stream", "write") == {topics.alerts, topics.dlq}
    assert allowed("responder", "read") == {topics.alerts, topics.commands, topics.emergencies}
    assert allowed("responder", "write") == {
        topics.commands,
        topics.alerts,
        topics.dlq,
        topics.device_twin,
        topics.emergencies,
    }
    assert {g.user for g in topic_grants if g.name == topics.alerts and g.operation == "write"} == {
        "stream",
        "responder",
    }
    assert {g.user for g in topic_grants if g.name == topics.raw and g.operation == "write"} == {"gateway"}
    groups = {(g.user, g.name) for g in grants if g.resource == "group"}
    assert groups == {(user, prefix) for user, prefixes in GROUP_PREFIXES.items() for prefix in prefixes}
    assert all(g.prefixed and g.operation == "read" for g in grants if g.resource == "group")
    assert len(acl_bindings(grants)) == len(grants)  # each a valid ACL binding for the admin API


def test_the_sites_mirror_maker_and_relay_have_least_privilege() -> None:
    """MirrorMaker 2's user describes the cluster (never ALTER: it creates no ACLs), reads
    what it copies, and writes only replicas (``<other cluster>.*``) and its own topics; the
    centre grants the stream and the responder the sites' replicas they read, a site the
    relay (the responder's user) the replica of the commands and the replies it writes."""
    from iotwatch.application.provision.kafka_acls import MIRROR_USER, mirror_grants, service_grants
    from iotwatch.settings import TopicSettings

    topics = TopicSettings()
    writes = ("create", "write", "alter", "alter_configs")
    for grants, copied, replicas in (
        (mirror_grants(topics, ["site1"]), {topics.commands}, "site1."),
        (mirror_grants(topics, [], "site1"), {topics.raw, topics.dlq, topics.replies}, "central."),
    ):
        assert {g.user for g in grants} == {MIRROR_USER}
        assert [(g.name, g.operation) for g in grants if g.resource == "cluster"] == [("kafka-cluster", "describe")]
        on_topics = [g for g in grants if g.resource == "topic"]
        assert not any(g.name in ("*", "") for g in on_topics)
        assert {(g.name, g.prefixed) for g in on_topics if g.operation in writes} == {
            (replicas, True),
            ("mm2-", True),
            ("heartbeats", False),
        }
        assert {g.name for g in on_topics if g.operation == "read" and not g.prefixed} == copied | {"heartbeats"}
    centre = service_grants(topics, ["site1"])
    assert {(g.user, g.name) for g in centre if g.name.startswith("site1.")} == {
        ("stream", "site1.iot.telemetry.raw"),
        ("responder", "site1.iot.commands.replies"),
    }
    assert all(g.operation == "read" for g in centre if g.name.startswith("site1."))
    site = service_grants(topics, at_site=True)
    assert {(g.name, g.operation) for g in site if g.user == "responder"} >= {
        (topics.commands_replica, "read"),
        (topics.replies, "write"),
        (topics.device_twin, "write"),
    }


# --- service configuration files ---------------------------------------------------------


def test_grafana_datasource_uses_influxql(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    provisioning = host_path(grafana, "/etc/grafana/provisioning")
    assert provisioning is not None, "grafana: /etc/grafana/provisioning is not mounted"
    grafana_env = environment_of(grafana)
    datasources = []
    for path in sorted((provisioning / "datasources").glob("*.y*ml")):
        text = path.read_text()
        for variable in referenced_variables(text):
            assert variable in grafana_env, f"{path.name}: ${variable} is not set on the grafana service"
        datasources += [(path.name, ds) for ds in yaml.safe_load(text).get("datasources") or []]
    influx = [(file, ds) for file, ds in datasources if ds.get("type") == "influxdb"]
    assert influx, "no InfluxDB datasource is provisioned"
    for file, ds in influx:
        json_data, secure = ds.get("jsonData") or {}, ds.get("secureJsonData") or {}
        assert json_data.get("version") == "InfluxQL", f"{file}: {ds['name']} must use InfluxQL"
        assert urlsplit(ds["url"]).hostname in compose["services"], f"{file}: {ds['url']} is no compose service"
        assert json_data.get("dbName") or ds.get("database"), f"{file}: no database name"
        # The read-only user of deploy/influxdb/initdb/20-iotwatch-auth.sh, not the admin token.
        assert ds.get("user") == "$INFLUX_USER" and secure.get("password") == "$INFLUX_PASSWORD", (
            f"{file}: Grafana must log in as the read-only InfluxDB user"
        )
        assert grafana_env["INFLUX_PASSWORD"] == "${INFLUXDB_READER_PASSWORD:?set INFLUXDB_READER_PASSWORD in .env}"


def test_grafana_dashboards_provider_reads_the_mounted_folder(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    provisioning = host_path(grafana, "/etc/grafana/provisioning")
    assert provisioning is not None
    paths = [
        provider["options"]["path"]
        for file in sorted((provisioning / "dashboards").glob("*.y*ml"))
        for provider in yaml.safe_load(file.read_text()).get("providers") or []
    ]
    assert paths, "no dashboard provider is provisioned"
    for path in paths:
        assert host_path(grafana, path) == (REPO / "dashboards" / "json").resolve(), (
            f"dashboard provider path {path} is not where dashboards/json is mounted"
        )


def test_mosquitto_refuses_anonymous_clients(compose: dict[str, Any]) -> None:
    mosquitto = compose["services"]["mosquitto"]
    command = mosquitto["command"] if isinstance(mosquitto["command"], list) else shlex.split(mosquitto["command"])
    config_path = host_path(mosquitto, command[command.index("-c") + 1])
    assert config_path is not None and config_path.is_file(), "the mosquitto config file is not mounted"
    directives: dict[str, list[str]] = {}
    for line in config_path.read_text().splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            directives.setdefault(words[0], []).append(" ".join(words[1:]))
    assert directives.get("allow_anonymous"), "allow_anonymous must be set explicitly"
    assert all(value == "false" for value in directives["allow_anonymous"]), "anonymous access is allowed"
    if directives.get("per_listener_settings") == ["true"]:
        assert len(directives["allow_anonymous"]) >= len(directives.get("listener", [])), "a listener allows anonymous"
    password_file = directives.get("password_file", [""])[-1]
    assert password_file, "no password_file"
    assert directives.get("acl_file"), "no acl_file"
    # The entry point generates exactly the files the config names, with mosquitto_passwd -b.
    entrypoint = host_path(mosquitto, mosquitto["entrypoint"][-1])
    assert entrypoint is not None and entrypoint.is_file(), "the mosquitto entry point script is not mounted"
    script = entrypoint.read_text()
    assert "mosquitto_passwd" in script and " -b " in script
    for name in (PurePosixPath(password_file).name, PurePosixPath(directives["acl_file"][-1]).name):
        assert name in script, f"entrypoint.sh does not write {name}"


def test_influxdb_init_script_creates_the_dbrp_mapping(compose: dict[str, Any]) -> None:
    influxdb = compose["services"]["influxdb"]
    scripts = [
        (source, target)
        for source, target in bind_mounts(influxdb)
        if target.startswith("/docker-entrypoint-initdb.d/")
    ]
    assert scripts, "no init script is mounted in /docker-entrypoint-initdb.d"
    for source, target in scripts:
        assert target.endswith(".sh")
        # The image runs them with run-parts, which silently skips non-executable files.
        assert os.access(source, os.X_OK), f"{source.relative_to(REPO)} must be executable (chmod +x)"
    texts = [source.read_text() for source, _target in scripts]
    assert any("v1 dbrp create" in text for text in texts), "no script creates the DBRP mapping"
    # Least privilege: one write-only and one read-only v1 user on the bucket.
    auth = "\n".join(texts)
    assert "--write-bucket" in auth and "--read-bucket" in auth, "no per-service InfluxDB users"
    influx_env = environment_of(influxdb)
    for key in ("INFLUX_WRITER_PASSWORD", "INFLUX_READER_PASSWORD"):
        assert key in influx_env and f"${{{key}" in auth, key
    # One database name everywhere: the DBRP mapping, iotwatch's writes, Grafana's queries.
    database = environment_of(influxdb)["DBRP_DATABASE"]
    assert environment_of(compose["services"]["grafana"])["INFLUX_DATABASE"] == database
    for name in ("gateway", "stream"):
        assert environment_of(compose["services"][name])["IOTWATCH_INFLUX_DATABASE"] == database


def test_compose_runs_the_kafka_version_of_the_embedded_stack(compose: dict[str, Any]) -> None:
    """Tests and deployment run one broker: the compose image's tag is the version whose jars
    ``iotwatch setup`` resolves for the embedded stack."""
    from iotwatch.jvm.jars import KAFKA_VERSION

    assert compose["services"]["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"


def test_the_sites_profile_links_its_site_to_the_centre_as_the_embedded_stack_does(compose: dict[str, Any]) -> None:
    """The site's MirrorMaker logs in on both clusters with SCRAM as the mirror user, and its
    configuration runs the embedded stack's flows and replication settings
    (application/stack/mirror_maker.py); the site's relay delivers the centre's commands."""
    from iotwatch.application.stack.mirror_maker import PLUGIN_DISCOVERY, REPLICATION_SETTINGS

    services = compose["services"]
    site = {name: svc for name, svc in services.items() if name.startswith("site1-")}
    assert set(site) == {
        "site1-mosquitto",
        "site1-kafka",
        "site1-kafka-topics",
        "site1-gateway",
        "site1-simulator",
        "site1-mirror",
        "site1-relay",
        "site1-central-kafka-topics",
    }
    assert all(svc["profiles"] == ["sites"] for svc in site.values())
    assert not any("profiles" in svc for name, svc in services.items() if name not in site)
    mirror = services["site1-mirror"]
    assert mirror["image"] == services["kafka"]["image"]
    env = environment_of(mirror)
    # the link to the centre leaves the site: the centre's REPLICATION listener, SASL_SSL
    assert (env["SITE_BOOTSTRAP"], env["CENTRAL_BOOTSTRAP"]) == (
        "site1-kafka:9092",
        "${KAFKA_REPLICATION_HOST:-kafka}:9095",
    )
    entrypoint = host_path(mirror, mirror["entrypoint"][-1])
    template = host_path(mirror, "/iotwatch/mirror/mm2.properties")
    assert entrypoint is not None and template is not None
    script = entrypoint.read_text()
    assert "security.protocol=SASL_PLAINTEXT" in script and "sasl.mechanism=SCRAM-SHA-512" in script
    assert "central.security.protocol=SASL_SSL" in script and "central.ssl.truststore.type=PEM" in script
    assert host_path(mirror, "/iotwatch/tls/ca.crt") == REPO / "deploy/kafka/tls/ca.crt"
    lines = [line for line in template.read_text().splitlines() if line and not line.startswith("#")]
    properties = dict(line.split("=", 1) for line in lines)
    assert {k: v for k, v in properties.items() if k in REPLICATION_SETTINGS} == REPLICATION_SETTINGS
    assert properties["SITE.plugin.discovery"] == properties["central.plugin.discovery"] == PLUGIN_DISCOVERY
    assert properties["SITE->central.topics"] == r"iot\\.telemetry\\.raw|iot\\.telemetry\\.dlq|iot\\.commands\\.replies"
    assert properties["central->SITE.topics"] == r"iot\\.commands"
    # the mirror user, with the grants of the site's init step and the centre's for this site
    assert 'username=\\"mirror\\" password=\\"$SCRAM_MIRROR_PASSWORD\\"' in script and "admin" not in script
    assert set(env) == {"SITE", "SITE_BOOTSTRAP", "CENTRAL_BOOTSTRAP", "SCRAM_MIRROR_PASSWORD"}
    assert "9095" in environment_of(services["kafka"])["KAFKA_LISTENERS"]
    assert services["site1-kafka-topics"]["command"][-2:] == ["--site", "site1"]
    assert services["site1-central-kafka-topics"]["command"][-2:] == ["--linked-site", "site1"]
    assert environment_of(services["site1-central-kafka-topics"])["IOTWATCH_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert set(mirror["depends_on"]) == {"site1-kafka-topics", "site1-central-kafka-topics"}
    relay = environment_of(services["site1-relay"])
    assert services["site1-relay"]["command"][-1] == "relay"
    assert (relay["IOTWATCH_KAFKA_BOOTSTRAP_SERVERS"], relay["IOTWATCH_MQTT_URL"]) == (
        "site1-kafka:9092",
        "mqtt://site1-mosquitto:1883",
    )
    assert environment_of(services["responder"])["IOTWATCH_RESPOND_DELIVERY"] == "${RESPOND_DELIVERY:-mqtt}"
    assert environment_of(services["site1-kafka"])["KAFKA_ADVERTISED_LISTENERS"] == "INTERNAL://site1-kafka:9092"
