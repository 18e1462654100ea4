"""``iotwatch stack up|down|status``: the servers, their state file and their health
(docs/internals.md, "Embedded stack")."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from iotwatch.application.stack.influxdb import influxd_binary, start_influxdb
from iotwatch.application.stack.kafka_broker import (
    HOST,
    KafkaSecurity,
    replication_factor,
    restart_kafka_node,
    start_kafka_broker,
    start_kafka_cluster,
)
from iotwatch.application.stack.mirror_maker import remote_topic
from iotwatch.application.stack.mqtt_broker import start_mqtt_broker
from iotwatch.application.stack.process import restart_process, stop_process, wait_until
from iotwatch.application.stack.service import RunningService
from iotwatch.application.stack.sites import (
    edge_topics,
    raw_pattern,
    site_names,
    site_role,
    split_role,
    start_site_link,
    start_site_servers,
)
from iotwatch.certificates import CA_CERT, KafkaKeystore, make_kafka_keystore
from iotwatch.clients.influx import InfluxV1Client
from iotwatch.clients.kafka import ensure_pipeline_topics, list_topics
from iotwatch.clients.mqtt import round_trip
from iotwatch.errors import IotwatchError, MissingArtifacts, StackError
from iotwatch.settings import InfluxSettings, KafkaSettings, MqttSettings, RespondSettings, Settings, TopicSettings

log = logging.getLogger(__name__)

STATE_FILE = "stack.json"
#: The run directory's folder of the private CA and the Kafka nodes' keystore (``stack.tls``).
TLS_FOLDER = "tls"
#: The one certificate every embedded Kafka node presents: they all listen on the loopback.
TLS_BROKER = "kafka"
TLS_HOSTS = [HOST, "localhost"]
START_ATTEMPTS = 2  # a free port can be taken between choosing it and binding it


@dataclass
class StackState:
    """What ``stack up`` started; persisted as ``<run_dir>/stack.json``."""

    run_dir: Path
    services: dict[str, RunningService] = field(default_factory=dict)
    topics: list[str] = field(default_factory=list)
    partitions: int = 0
    database: str | None = None
    started_at: float = field(default_factory=time.time)
    #: The CA certificate the Kafka nodes' TLS listeners are verified with (None: plaintext).
    ca_file: str | None = None
    #: The topic names the stack was started with (a ``--config`` file's ``[topics]`` included),
    #: which its site topics, its clients' raw pattern and its health checks follow.
    topic_settings: TopicSettings = field(default_factory=TopicSettings)

    def endpoints(self) -> dict[str, str | None]:
        """Where clients reach each server; Kafka's is every central node (bootstrap servers)."""
        ends = {role: (svc.endpoint if (svc := self.services.get(role)) else None) for role in ("mqtt", "influx")}
        kafka = ",".join(self.services[role].endpoint for role in self.kafka_nodes)
        return {"mqtt": ends["mqtt"], "kafka": kafka or None, "influx": ends["influx"]}

    @property
    def kafka_nodes(self) -> list[str]:
        """The roles of the central Kafka cluster's nodes: ``kafka``, then ``kafka-2``, ..."""
        return [role for role in self.services if is_kafka_node(role)]

    @property
    def sites(self) -> list[str]:
        """The edge sites (none for a one-cluster stack), in start order."""
        return [site for role in self.services if (site := split_role(role)[0]) and split_role(role)[1] == "kafka"]

    def kafka_security(self) -> dict[str, Any]:
        """How clients connect to the stack's Kafka nodes: TLS verified with :attr:`ca_file`
        when the stack has it, else plaintext; no users either way."""
        tls = self.ca_file is not None
        return {
            "security_protocol": "SSL" if tls else "PLAINTEXT",
            "ssl_ca_location": Path(self.ca_file) if self.ca_file else None,
            "sasl_mechanism": None,
            "sasl_username": None,
            "sasl_password": None,
        }

    def kafka_client(self, endpoint: str) -> KafkaSettings:
        """Client settings for one of the stack's Kafka clusters (``endpoint``), whatever the
        caller's IOTWATCH_KAFKA_* variables say."""
        return KafkaSettings(bootstrap_servers=endpoint, **self.kafka_security())

    def site_endpoints(self, site: str) -> dict[str, str]:
        """The site's MQTT broker and Kafka cluster, as its devices and gateway reach them."""
        return {kind: self.services[site_role(site, kind)].endpoint for kind in ("mqtt", "kafka")}

    def apply_to(self, settings: Settings) -> Settings:
        """The settings with this stack's endpoints (InfluxDB disabled if it did not start);
        with sites, the streaming job reads every site's replica of the raw topic and the
        responder's commands go to the sites' relays."""
        ends = self.endpoints()
        applied = settings.with_endpoints(mqtt=ends["mqtt"], kafka=ends["kafka"], influx=ends["influx"] or "")
        if len(self.kafka_nodes) > 1:
            kafka = applied.kafka.model_copy(update={"replication_factor": replication_factor(len(self.kafka_nodes))})
            applied = applied.model_copy(update={"kafka": kafka})
        applied = applied.model_copy(update={"kafka": applied.kafka.model_copy(update=self.kafka_security())})
        if self.sites:
            topics = applied.topics.model_copy(update={"raw_pattern": raw_pattern(applied.topics)})
            respond = applied.respond.model_copy(update={"delivery": "sites"})
            applied = applied.model_copy(update={"topics": topics, "respond": respond})
        return applied

    def env(self) -> dict[str, str]:
        """IOTWATCH_* variables pointing another process at this stack (its central part
        when it has sites: :meth:`site_env` for a site's gateway and devices)."""
        ends = self.endpoints()
        variables = {
            "IOTWATCH_MQTT_URL": ends["mqtt"] or "",
            "IOTWATCH_KAFKA_BOOTSTRAP_SERVERS": ends["kafka"] or "",
            "IOTWATCH_INFLUX_URL": ends["influx"] or "",
        }
        if self.database:
            variables["IOTWATCH_INFLUX_DATABASE"] = self.database
        if len(self.kafka_nodes) > 1:
            variables[KafkaSettings.env_name("replication_factor")] = str(replication_factor(len(self.kafka_nodes)))
        if self.ca_file is not None:
            variables[KafkaSettings.env_name("security_protocol")] = "SSL"
            variables[KafkaSettings.env_name("ssl_ca_location")] = self.ca_file
        if self.sites:
            del variables["IOTWATCH_MQTT_URL"]  # devices connect to their site
            variables[TopicSettings.env_name("raw_pattern")] = raw_pattern(self.topic_settings)
            # the responder writes commands to the centre; each site's relay delivers them
            variables[RespondSettings.env_name("delivery")] = "sites"
        return variables

    def site_env(self, site: str) -> dict[str, str]:
        """IOTWATCH_* variables pointing a site's gateway and devices at the site's servers."""
        ends = self.site_endpoints(site)
        return {**self.env(), "IOTWATCH_MQTT_URL": ends["mqtt"], "IOTWATCH_KAFKA_BOOTSTRAP_SERVERS": ends["kafka"]}

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "started_at": self.started_at,
            "endpoints": self.endpoints(),
            "ca_file": self.ca_file,
            "topics": self.topics,
            "partitions": self.partitions,
            "influx_database": self.database,
            "env": self.env(),
            "sites": {site: {**self.site_endpoints(site), "env": self.site_env(site)} for site in self.sites},
            "services": msgspec.to_builtins(self.services),
            "topic_settings": self.topic_settings.model_dump(),
        }

    def save(self) -> None:
        path = self.run_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, run_dir: Path) -> StackState | None:
        path = run_dir / STATE_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        services = msgspec.convert(data["services"], dict[str, RunningService])
        return cls(
            run_dir,
            services,
            data["topics"],
            data["partitions"],
            data["influx_database"],
            data["started_at"],
            data.get("ca_file"),
            TopicSettings(**data.get("topic_settings", {})),
        )


def last_stack_file() -> Path:
    """Where ``stack up`` notes its run directory, for ``status`` and ``down`` without ``--run-dir``."""
    return Path.home() / ".iotwatch" / "last-stack"


def remember_last_stack(run_dir: Path) -> None:
    path = last_stack_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{run_dir}\n")


def resolve_run_dir(settings: Settings, run_dir: Path | None) -> Path:
    """The run directory a command means: ``--run-dir``, else IOTWATCH_STACK_RUN_DIR (or the
    TOML file's), else the last stack started that is still recorded, else the default."""
    if run_dir is not None:
        return Path(run_dir).expanduser().resolve()
    if "run_dir" not in settings.stack.model_fields_set:
        try:
            last = Path(last_stack_file().read_text().strip())
        except OSError:
            last = None
        if last is not None and (last / STATE_FILE).exists():
            return last
    return Path(settings.stack.run_dir).expanduser().resolve()


def forget_last_stack(run_dir: Path) -> None:
    """Drop the note of ``run_dir`` (it was stopped)."""
    path = last_stack_file()
    try:
        if Path(path.read_text().strip()) == run_dir:
            path.unlink()
    except OSError:
        pass


class EmbeddedStack:
    """Starts and stops the embedded servers for one run directory."""

    def __init__(self, settings: Settings, run_dir: Path | None = None) -> None:
        self.settings = settings
        self.run_dir = Path(run_dir or settings.stack.run_dir).expanduser().resolve()

    # -- up ---------------------------------------------------------------------------

    def up(self) -> StackState:
        """Start every server, create topics and database; on any failure (or Ctrl-C)
        stop whatever was already started before re-raising."""
        existing = StackState.load(self.run_dir)
        if existing is not None:
            if all(svc.process.is_running() for svc in existing.services.values()):
                raise StackError(
                    f"a stack is already running from {self.run_dir} "
                    f"(iotwatch stack down --run-dir {self.run_dir} first)"
                )
            if any(svc.process.is_running() for svc in existing.services.values()):
                # half-dead: start what died where its clients expect it; every shell's
                # exports stay valid (a new stack would move every port)
                for role, svc in list(existing.services.items()):
                    if not svc.process.is_running():
                        self.restart_service(existing, role)
                return existing
            (self.run_dir / STATE_FILE).unlink(missing_ok=True)  # all dead: start afresh
        self.run_dir.mkdir(parents=True, exist_ok=True)
        state = StackState(self.run_dir, topic_settings=self.settings.topics)
        timeout = self.settings.stack.startup_timeout_s
        sites = site_names(self.settings.stack.sites)
        if self.settings.stack.tls:
            state.ca_file = str(self._keystore(issue=True).ca_file)
        try:
            if not sites:  # with sites, devices connect to their site's broker
                self._start(state, lambda: start_mqtt_broker(self.run_dir, self.settings.stack.mqtt_broker, timeout))
            self._start_kafka(state)
            state.partitions = self.settings.kafka.partitions
            kafka = state.apply_to(self.settings).kafka
            topics = self.settings.topics
            ensure_pipeline_topics(kafka, topics)
            state.topics = topics.kafka_topics() + topics.compacted_topics()
            if self._want_influx():
                database = self.settings.influx.database
                self._start(state, lambda: start_influxdb(self.run_dir, database, timeout))
                state.database = database
            for site in sites:
                self._start_site(state, site, kafka)
            state.save()
        except BaseException:
            self._stop_services(state)
            (self.run_dir / STATE_FILE).unlink(missing_ok=True)
            raise
        return state

    def _start_kafka(self, state: StackState) -> None:
        """The central Kafka: one node, or a cluster of ``stack.kafka_nodes`` (roles ``kafka``,
        ``kafka-2``, ...), replicated as :func:`replication_factor` says."""
        timeout = self.settings.stack.startup_timeout_s
        nodes = self.settings.stack.kafka_nodes
        security = self._security(state)
        if nodes == 1:
            self._start(state, lambda: start_kafka_broker(self.run_dir, timeout, security=security))
            return
        cluster = start_kafka_cluster(self.run_dir, timeout, nodes=nodes, security=security)
        for node_id, service in enumerate(cluster, start=1):
            state.services[kafka_node_role(node_id)] = replace(service, role=kafka_node_role(node_id))
        state.save()

    def _start_site(self, state: StackState, site: str, central: KafkaSettings) -> None:
        """A site's MQTT broker and Kafka node, then its MirrorMaker to the centre."""
        timeout = self.settings.stack.startup_timeout_s
        for service in start_site_servers(
            self.run_dir,
            site,
            self.settings.stack.mqtt_broker,
            central,
            self.settings.topics,
            timeout,
            self._security(state),
        ):
            state.services[service.role] = service
        state.save()
        edge = state.services[site_role(site, "kafka")].endpoint
        self._start(
            state,
            lambda: start_site_link(self.run_dir, site, edge, central, self.settings.topics, timeout),
        )

    def _keystore(self, *, issue: bool = False) -> KafkaKeystore:
        """The Kafka nodes' keystore in ``tls/``; ``issue``: a fresh certificate from the
        folder's CA (made on the first start, kept afterwards)."""
        folder = self.run_dir / TLS_FOLDER
        if issue:
            return make_kafka_keystore(folder, folder, TLS_BROKER, TLS_HOSTS)
        keystore, password = folder / f"{TLS_BROKER}.p12", folder / f"{TLS_BROKER}.p12.password"
        return KafkaKeystore(TLS_BROKER, tuple(TLS_HOSTS), keystore, password, folder / CA_CERT)

    def _security(self, state: StackState) -> KafkaSecurity | None:
        """How the stack's Kafka nodes secure their listener: TLS when it has a CA, else not at all."""
        return KafkaSecurity(tls=self._keystore()) if state.ca_file is not None else None

    def _want_influx(self) -> bool:
        choice = self.settings.stack.influxdb
        if choice == "none":
            return False
        if choice == "auto" and influxd_binary() is None:
            log.warning(
                "influxd not found: the stack runs without InfluxDB "
                "(apt-get install -y influxdb to get metrics and dashboards)"
            )
            return False
        return True

    @staticmethod
    def _start(state: StackState, starter: Callable[[], RunningService]) -> None:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                service = starter()
            except StackError as exc:
                if attempt == START_ATTEMPTS or isinstance(exc, MissingArtifacts):
                    raise
                log.warning("retrying after start-up failure: %s", exc)
                continue
            state.services[service.role] = service
            state.save()  # a crash from here on still leaves a record for `stack down`
            return

    def restart_service(self, state: StackState, role: str) -> RunningService:
        """Start a stopped server of ``state`` again where its clients expect it (its port,
        its data folder) and record the new process in the state file."""
        old = state.services[role]
        timeout = self.settings.stack.startup_timeout_s
        port = int(old.endpoint.rsplit(":", 1)[1])
        if role == "mqtt":
            new = start_mqtt_broker(self.run_dir, self.settings.stack.mqtt_broker, timeout, port=port)
        elif is_kafka_node(role) or split_role(role)[1] == "kafka":
            new = replace(restart_kafka_node(old, timeout, self._security(state)), role=role)
        elif role == "influx":
            new = start_influxdb(self.run_dir, state.database or self.settings.influx.database, timeout, port=port)
        else:  # a site's broker or MirrorMaker: its own command again, until it is healthy
            record = restart_process(old.process)
            new = replace(old, process=record)
            wait_until(lambda: bool(_health_check(new, state)), timeout_s=timeout, what=role, record=record)
        state.services[role] = new
        state.save()
        return new

    # -- one server at a time ----------------------------------------------------------

    def service(self, role: str) -> tuple[StackState, RunningService]:
        """The running stack's state and its server ``role`` (StackError naming the roles)."""
        state = StackState.load(self.run_dir)
        if state is None:
            raise StackError(f"no stack in {self.run_dir} (iotwatch stack up first)")
        if role not in state.services:
            raise StackError(f"no server {role!r} in the stack of {self.run_dir}: {', '.join(state.services)}")
        return state, state.services[role]

    def stop_service(self, role: str) -> bool:
        """Stop one server, keeping its record (port, data, command) for ``start_service``;
        False if it was not running."""
        _state, service = self.service(role)
        if not service.process.is_running():
            return False
        stop_process(service.process)
        return True

    def start_service(self, role: str) -> bool:
        """Start one stopped server on its own port with its own data; False if it was
        running already."""
        state, service = self.service(role)
        if service.process.is_running():
            return False
        self.restart_service(state, role)
        return True

    # -- down / status -----------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop what ``up`` started; returns the roles stopped. Data is left on disk."""
        state = StackState.load(self.run_dir)
        if state is None:
            return []
        stopped = self._stop_services(state)
        (self.run_dir / STATE_FILE).unlink(missing_ok=True)
        return stopped

    def remove_data(self) -> None:
        """Delete the run directory (only when nothing is running from it)."""
        if StackState.load(self.run_dir) is not None:
            raise StackError(f"stack in {self.run_dir} is still up")
        shutil.rmtree(self.run_dir, ignore_errors=True)

    @staticmethod
    def _stop_services(state: StackState) -> list[str]:
        stopped = []
        for role in reversed(list(state.services)):
            service = state.services[role]
            if service.process.is_running():
                stop_process(service.process)
                stopped.append(role)
        return stopped

    def status(self) -> dict[str, Any]:
        """Each service's process state and the answer of a real client."""
        state = StackState.load(self.run_dir)
        if state is None:
            return {"run_dir": str(self.run_dir), "up": False, "services": {}}
        services = {role: _service_status(svc, state) for role, svc in state.services.items()}
        return {
            "run_dir": str(self.run_dir),
            "up": all(s["healthy"] for s in services.values()),
            "endpoints": state.endpoints(),
            "services": services,
        }


def kafka_node_role(node_id: int) -> str:
    """The role of the central cluster's node ``node_id`` (1: ``kafka``, as in a one-node stack)."""
    return "kafka" if node_id == 1 else f"kafka-{node_id}"


def is_kafka_node(role: str) -> bool:
    """Whether ``role`` is a node of the central Kafka cluster."""
    name, _, number = role.partition("-")
    return name == "kafka" and (not number or number.isdigit())


def _service_status(service: RunningService, state: StackState) -> dict[str, Any]:
    result: dict[str, Any] = {
        "implementation": service.implementation,
        "endpoint": service.endpoint,
        "pid": service.process.pid,
        "running": service.process.is_running(),
        "log": service.process.log_file,
    }
    if not result["running"]:
        return {**result, "healthy": False, "detail": "process is not running"}
    try:
        result["detail"] = _health_check(service, state)
        result["healthy"] = True
    except IotwatchError as exc:
        result.update(healthy=False, detail=str(exc))
    return result


def _health_check(service: RunningService, state: StackState) -> str:
    site, kind = split_role(service.role)
    if kind == "mqtt":
        round_trip(MqttSettings(url=service.endpoint))
        return "publish/subscribe round trip ok"
    if kind == "kafka" or is_kafka_node(kind):
        topics = list_topics(state.kafka_client(service.endpoint))
        wanted = edge_topics(state.topic_settings) if site else state.topics
        missing = [name for name in wanted if name not in topics]
        return f"{len(topics)} topics" + (f", missing {missing}" if missing else "")
    if kind == "mirror":
        central = list_topics(state.kafka_client(state.services["kafka"].endpoint))
        replicas = [remote_topic(site or "", name) for name in edge_topics(state.topic_settings)]
        missing = [name for name in replicas if name not in central]
        return "replicas at the centre: " + (f"missing {missing}" if missing else ", ".join(replicas))
    client = InfluxV1Client(InfluxSettings(url=service.endpoint, database=state.database or "iotwatch"))
    try:
        return f"ping ok, version {client.ping()}"
    finally:
        client.close()
