"""Apache Kafka in KRaft mode: the broker the embedded stack, the tests and the benches run
(docs/operate/stack.md). Each node is one JVM, both broker and controller, in its own folder,
its log directory formatted once, so a node started again keeps its data. SCRAM users (with
the ACL authorizer) and TLS on the client listener are as in docker-compose.yml.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from iotwatch.application.stack.process import (
    ProcessRecord,
    free_port,
    port_open,
    restart_process,
    start_process,
    stop_process,
    wait_until,
)
from iotwatch.application.stack.service import RunningService
from iotwatch.certificates import KafkaKeystore
from iotwatch.clients.kafka import list_topics
from iotwatch.errors import StackError
from iotwatch.jvm import class_data
from iotwatch.jvm.jars import KAFKA_VERSION, java_executable, kafka_broker
from iotwatch.settings import KafkaSettings, SecurityProtocol

HOST = "127.0.0.1"
IMPLEMENTATION = f"apache-kafka {KAFKA_VERSION}"
#: A small heap (the embedded broker shares a laptop-sized machine with Spark), committed and
#: touched at start as Kafka's production advice has it: the broker's RSS is its size from the
#: first minute instead of climbing towards the limit, so growth is visible as growth.
HEAP_OPTIONS = ["-Xms512m", "-Xmx512m", "-XX:+AlwaysPreTouch"]
#: A site's edge node carries one site's readings: a smaller heap still.
EDGE_HEAP_OPTIONS = ["-Xms256m", "-Xmx256m", "-XX:+AlwaysPreTouch"]
JVM_OPTIONS = ["-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true"]
#: The principal every SCRAM-secured broker uses between its own nodes; a super user.
ADMIN_USER = "admin"
SCRAM_MECHANISM = "SCRAM-SHA-512"

LOG4J_CONFIG = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.state.name = state.change.logger
logger.state.level = warn
"""


@dataclass(frozen=True)
class KafkaSecurity:
    """SASL/SCRAM users (name -> password) and the ACL authorizer, ``admin`` the super user;
    and/or TLS on the client listener with ``tls``'s keystore."""

    passwords: Mapping[str, str] = field(default_factory=dict)
    tls: KafkaKeystore | None = None

    @property
    def sasl(self) -> bool:
        return bool(self.passwords)

    @property
    def protocol(self) -> SecurityProtocol:
        """The client listener's security protocol."""
        if self.sasl:
            return "SASL_SSL" if self.tls else "SASL_PLAINTEXT"
        return "SSL" if self.tls else "PLAINTEXT"

    def admin_password(self) -> str:
        return self.passwords[ADMIN_USER]


@dataclass(frozen=True)
class KafkaNodeSpec:
    """Where one node listens and keeps its files."""

    node_id: int
    port: int
    controller_port: int
    folder: Path

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.port}"


def start_kafka_broker(
    run_dir: Path, timeout_s: float, *, security: KafkaSecurity | None = None, heap: list[str] | None = None
) -> RunningService:
    """One combined broker and controller in ``run_dir/kafka`` on a free port; waits until an
    admin client lists its topics."""
    return start_kafka_cluster(run_dir, timeout_s, nodes=1, security=security, heap=heap)[0]


def start_kafka_cluster(
    run_dir: Path,
    timeout_s: float,
    *,
    nodes: int = 3,
    security: KafkaSecurity | None = None,
    heap: list[str] | None = None,
) -> list[RunningService]:
    """``nodes`` combined brokers and controllers forming one cluster; a single node lives in
    ``run_dir/kafka``, the nodes of a larger cluster in ``run_dir/kafka-<id>``; ``heap``: the
    JVM's heap options (default :data:`HEAP_OPTIONS`)."""
    specs = [
        KafkaNodeSpec(
            node_id=i,
            port=free_port(HOST),
            controller_port=free_port(HOST),
            folder=run_dir / ("kafka" if nodes == 1 else f"kafka-{i}"),
        )
        for i in range(1, nodes + 1)
    ]
    cluster_id = _cluster_id(specs[0].folder)
    classpath = _classpath()
    voters = ",".join(f"{s.node_id}@{HOST}:{s.controller_port}" for s in specs)
    records = []
    for spec in specs:
        config = _write_config(spec, voters, nodes, security)
        _format(spec, config, cluster_id, classpath, security)
        tmp = spec.folder / "tmp"  # what a killed broker unpacked there (LZ4's native library) goes at its next start
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        options = [*(heap or HEAP_OPTIONS), *JVM_OPTIONS, f"-Djava.io.tmpdir={tmp}"]
        java = [java_executable(), *options, *_class_data(options, classpath), *_log_options(spec), "-cp", classpath]
        command = [*java, "kafka.Kafka", str(config)]
        records.append(start_process(f"kafka-{spec.node_id}", command, spec.folder / "broker.log", cwd=spec.folder))
    try:
        return [
            wait_for_broker(spec.endpoint, record, timeout_s, security)
            for spec, record in zip(specs, records, strict=True)
        ]
    except BaseException:
        for record in records:  # the nodes not waited for yet would be left running
            stop_process(record)
        raise


def replication_factor(nodes: int) -> int:
    """Replicas of each topic in a ``nodes``-node cluster: as many as nodes, at most 3
    (Kafka's usual); with 3, writes are acknowledged by 2 (``min.insync.replicas``), so one
    node may fail without loss or a pause in writes."""
    return min(3, nodes)


def restart_kafka_node(
    service: RunningService, timeout_s: float, security: KafkaSecurity | None = None
) -> RunningService:
    """Start a stopped node again with its own command, configuration and data."""
    return wait_for_broker(service.endpoint, restart_process(service.process), timeout_s, security)


def wait_for_broker(
    endpoint: str, record: ProcessRecord, timeout_s: float, security: KafkaSecurity | None = None
) -> RunningService:
    """Wait for the port (librdkafka logs each refused connection), then for metadata."""
    port = int(endpoint.rsplit(":", 1)[1])
    wait_until(lambda: port_open(HOST, port), timeout_s=timeout_s, what=f"Kafka broker port {port}", record=record)
    settings = admin_settings(endpoint, security)
    wait_until(
        lambda: isinstance(list_topics(settings, timeout_s=2.0), dict),
        timeout_s=timeout_s,
        what=f"Kafka broker ({IMPLEMENTATION}) on port {port}",
        record=record,
    )
    return RunningService("kafka", IMPLEMENTATION, endpoint, record)


def admin_settings(endpoint: str, security: KafkaSecurity | None = None) -> KafkaSettings:
    """Client settings for ``endpoint`` as the super user (or anonymous without users),
    verifying the broker's certificate with its CA when it has TLS. Every connection setting
    is given, so none comes from the caller's IOTWATCH_KAFKA_* variables (which may name
    another cluster's security)."""
    protocol: SecurityProtocol = security.protocol if security else "PLAINTEXT"
    sasl = security is not None and security.sasl
    return KafkaSettings(
        bootstrap_servers=endpoint,
        security_protocol=protocol,
        ssl_ca_location=security.tls.ca_file if security and security.tls else None,
        sasl_mechanism=SCRAM_MECHANISM if sasl else None,
        sasl_username=ADMIN_USER if sasl else None,
        sasl_password=SecretStr(security.admin_password()) if security and sasl else None,
    )


def _classpath() -> str:
    jars = kafka_broker().jars()
    return str(jars[0].parent / "*")


def _cluster_id(folder: Path) -> str:
    """The cluster's id, kept beside the first node so every start agrees."""
    path = folder.parent / "kafka-cluster-id"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=") + "\n")
    return path.read_text().strip()


def _write_config(spec: KafkaNodeSpec, voters: str, nodes: int, security: KafkaSecurity | None) -> Path:
    spec.folder.mkdir(parents=True, exist_ok=True)
    replicas = replication_factor(nodes)
    client_protocol = security.protocol if security else "PLAINTEXT"
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(spec.node_id),
        "controller.quorum.voters": voters,
        "listeners": f"CLIENT://{HOST}:{spec.port},CONTROLLER://{HOST}:{spec.controller_port}",
        "advertised.listeners": f"CLIENT://{HOST}:{spec.port}",
        "listener.security.protocol.map": f"CLIENT:{client_protocol},CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "CLIENT",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": str(spec.folder / "data"),
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(2 if replicas >= 3 else 1),
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min(replicas, 2)),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(min(replicas, 2)),
        "group.initial.rebalance.delay.ms": "0",
        # A node started again after kill -9 registers anew, and its controller refuses the
        # registration while the old one's session lasts, counted from the controller's own
        # start (in one combined node, the same JVM's): the default 9 s were the longest step
        # of a broker's restart (KAFKA-19130 spares only a clean shutdown). The node asks again
        # every heartbeat interval; heartbeats three times a session (KAFKA-19432: at least two).
        "broker.session.timeout.ms": "1500",
        "broker.heartbeat.interval.ms": "500",
        # After kill -9 a node re-reads every segment written since its last roll (Kafka's
        # recovery point moves when a segment rolls and is flushed): with the default 1 GiB
        # segments that is each raw partition's whole log (20 MB each ten minutes into a chaos
        # run, 0.65 s of a restart on a quiet machine, 14 s on a loaded one). 16 MiB bounds it;
        # a roll every few minutes at 2,000 msg/s keeps one more file open, until retention.
        "log.segment.bytes": str(16 * 2**20),
        # a handful of consumer groups: 8 partitions of committed offsets instead of 50 are 42
        # fewer logs to recover when a node starts again after a crash
        "offsets.topic.num.partitions": "8",
        "num.partitions": "4",
        # the log cleaner (compaction) and the retention check run often, and the latter from
        # a second after start (not 30 s), so the tests of compaction and retention see them work
        "log.cleaner.backoff.ms": "1000",
        "log.retention.check.interval.ms": "5000",
        "log.initial.task.delay.ms": "1000",
    }
    if security and security.tls:
        settings.update(
            {
                "ssl.keystore.type": "PKCS12",
                "ssl.keystore.location": str(security.tls.keystore),
                "ssl.keystore.password": security.tls.password,
                # the nodes are each other's clients on this listener: they verify each other too
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(security.tls.ca_file),
            }
        )
    if security and security.sasl:
        login = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{ADMIN_USER}" password="{security.admin_password()}";'
        )
        settings.update(
            {
                "sasl.enabled.mechanisms": SCRAM_MECHANISM,
                "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
                f"listener.name.client.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": login,
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                # ANONYMOUS: the loopback CONTROLLER listener KRaft's own traffic uses
                "super.users": f"User:{ADMIN_USER};User:ANONYMOUS",
                "allow.everyone.if.no.acl.found": "false",
            }
        )
    path = spec.folder / "server.properties"
    path.write_text("".join(f"{key}={escape_property(value)}\n" for key, value in settings.items()))
    return path


def escape_property(value: str) -> str:
    """A Java properties value: backslashes and leading spaces would be read as escapes."""
    return value.replace("\\", "\\\\")


def _format(spec: KafkaNodeSpec, config: Path, cluster_id: str, classpath: str, security: KafkaSecurity | None) -> None:
    """Format the log directory unless it already is (a restart keeps its data)."""
    if (spec.folder / "data" / "meta.properties").exists():
        return
    command = [java_executable(), "-cp", classpath, "kafka.tools.StorageTool", "format", "--config", str(config)]
    # one argument: a generated id may begin with "-", which a separate argument would make an option
    command += [f"--cluster-id={cluster_id}", "--ignore-formatted"]
    for user, password in security.passwords.items() if security else ():
        command += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise StackError(f"formatting Kafka's log directory failed: {(result.stderr or result.stdout).strip()[-300:]}")


def _class_data(options: list[str], classpath: str) -> list[str]:
    """Class-data sharing for the broker's JVM (:mod:`iotwatch.jvm.class_data`): the classes of
    Kafka and its libraries mapped from an archive that the first broker of this Kafka release
    and options wrote as it stopped. It takes about a third off a node's start-up (on two loaded
    cores, 14-16 s instead of 20-28 s), most of what a restarted node spends before it
    recovers its logs."""
    return class_data.jvm_options(java_executable(), [IMPLEMENTATION, classpath, " ".join(options)]).split()


def _log_options(spec: KafkaNodeSpec) -> list[str]:
    """The broker's log, and its garbage collector's as Kafka's own start script keeps it
    (``kafkaServer-gc.log`` beside the log, rotated): a pause shows there with its length."""
    config = spec.folder / "log4j2.properties"
    config.write_text(LOG4J_CONFIG.format(level="INFO"))
    gc_log = spec.folder / "kafkaServer-gc.log"
    return [
        f"-Dlog4j2.configurationFile={config}",
        f"-Dkafka.logs.dir={spec.folder}",
        f"-Xlog:gc*:file={gc_log}:time,tags:filecount=2,filesize=10M",
    ]
