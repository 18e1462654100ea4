"""MQTT access control and TLS of the compose deployment, on a real mosquitto.

The files are made the way an operator makes them: ``iotwatch provision mqtt`` (per-device
accounts) and ``iotwatch provision tls`` (CA and server certificate), then
deploy/mosquitto/entrypoint.sh (service accounts, merged files), and mosquitto runs
deploy/mosquitto/mosquitto.conf itself with only its ports and paths rewritten. Clients are
paho over MQTT 5, so a refused publish shows in its PUBACK reason code, and a subscriber
with the gateway's account shows that nothing refused arrives. A missing mosquitto fails.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from iotwatch.application.stack.process import (
    ProcessRecord,
    free_port,
    port_open,
    start_process,
    stop_process,
    wait_until,
)
from iotwatch.contract import device_topics
from tests.conftest import REPO_ROOT
from tests.helpers import user_env

REPO = REPO_ROOT
IOTWATCH = [sys.executable, "-m", "iotwatch.application"]
SERVICE_ACCOUNTS = {
    "MQTT_USERNAME": "iotwatch",
    "MQTT_RESPONDER_USERNAME": "responder",
    "MQTT_DEVICE_USERNAME": "simulator",
}
D1 = ("home-1", "thermostat", "home-1-thermostat-0")
D2 = ("home-1", "leak_sensor", "home-1-leak_sensor-0")
NOT_AUTHORIZED = 0x87
ACCEPTED = (0x00, 0x10)  # PUBACK: success, or success with no subscriber yet
WAIT_S = 10.0


@dataclass
class Broker:
    port: int
    tls_port: int
    folder: Path
    passwords: dict[str, str]
    command: list[str]
    record: ProcessRecord | None = None

    def start(self) -> None:
        self.record = start_process("mosquitto-access", self.command, self.folder / "mosquitto.log")
        wait_until(
            lambda: port_open("127.0.0.1", self.port) and port_open("127.0.0.1", self.tls_port),
            timeout_s=15,
            what="mosquitto with the deployment's config",
            record=self.record,
        )

    def stop(self) -> None:
        """SIGTERM, as ``docker-compose stop`` sends: mosquitto saves its database on the way out."""
        if self.record is not None:
            stop_process(self.record)
            self.record = None


def service_password(user: str) -> str:
    return f"test-password-{user}"


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    assert Path(binary).exists(), "mosquitto is not installed (bootstrap.sh installs it)"
    # mosquitto reads the files as user mosquitto: a folder it can reach (pytest's is 0700)
    folder = Path(tempfile.mkdtemp(prefix="iotwatch-access-"))
    folder.chmod(0o711)
    try:
        yield from _run_broker(binary, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_broker(binary: str, folder: Path) -> Iterator[Broker]:
    fleet = folder / "fleet.csv"
    fleet.write_text("site,device_type,device_id\n" + "".join(f"{s},{t},{d}\n" for s, t, d in (D1, D2)))
    provisioned = iotwatch("provision", "mqtt", "--fleet", str(fleet), "--out", str(folder / "fleet"))
    iotwatch(
        "provision",
        "tls",
        "--out",
        str(folder / "tls"),
        "--host",
        "localhost",
        "--host",
        "127.0.0.1",
        "--kafka-out",
        str(folder / "kafka-tls"),
    )
    passwords = {user: service_password(user) for user in SERVICE_ACCOUNTS.values()}
    for _site, _type, device in (D1, D2):
        credentials = json.loads((folder / "fleet" / "devices" / f"{device}.json").read_text())
        assert credentials["password"] not in provisioned, "provision printed a device password"
        passwords[device] = credentials["password"]
    env = {
        **os.environ,
        "MQTT_AUTH_DIR": str(folder / "auth"),
        "MQTT_FLEET_DIR": str(folder / "fleet"),
        "MQTT_TLS_DIR": str(folder / "tls"),
        **SERVICE_ACCOUNTS,
        **{key.replace("USERNAME", "PASSWORD"): service_password(user) for key, user in SERVICE_ACCOUNTS.items()},
    }
    subprocess.run(["sh", str(REPO / "deploy/mosquitto/entrypoint.sh"), "true"], env=env, check=True, timeout=60)
    port, tls_port = free_port(), free_port()
    data = folder / "data"
    data.mkdir()
    shutil.chown(data, "mosquitto", "mosquitto")
    conf = (REPO / "deploy/mosquitto/mosquitto.conf").read_text()
    assert "listener 1883\n" in conf and "listener 8883\n" in conf
    conf = (
        conf.replace("listener 1883\n", f"listener {port} 127.0.0.1\n")
        .replace("listener 8883\n", f"listener {tls_port} 127.0.0.1\n")
        .replace("/mosquitto/auth", str(folder / "auth"))
        .replace("/mosquitto/data/", f"{data}/")
    )
    (folder / "mosquitto.conf").write_text(conf)
    (folder / "mosquitto.conf").chmod(0o644)
    broker = Broker(port, tls_port, folder, passwords, [binary, "-c", str(folder / "mosquitto.conf")])
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


def iotwatch(*args: str, env: dict[str, str] | None = None, stdout_only: bool = False) -> str:
    result = subprocess.run([*IOTWATCH, *args], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, f"iotwatch {' '.join(args)} failed: {result.stderr}"
    return result.stdout if stdout_only else result.stdout + result.stderr


class Client:
    """One account's MQTT 5 connection, recording what it receives and the broker's answers."""

    def __init__(
        self,
        broker: Broker,
        user: str,
        *,
        password: str | None = None,
        tls_ca: Path | None = None,
        connect: bool = True,
        session: str | None = None,
    ) -> None:
        self.received: list[tuple[str, bytes]] = []
        self.connected = threading.Event()
        self.connect_code: int | None = None
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=session or f"{user}-{uuid.uuid4().hex[:8]}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self.client.username_pw_set(user, password if password is not None else broker.passwords[user])
        self.client.on_message = lambda _c, _u, m: self.received.append((m.topic, m.payload))
        self.client.on_connect = self._on_connect
        port = broker.port
        if tls_ca is not None or not connect:
            self.client.tls_set(ca_certs=str(tls_ca) if tls_ca else None, cert_reqs=ssl.CERT_REQUIRED)
            port = broker.tls_port
        if connect:
            properties = None
            if session:  # a persistent session, as the gateway keeps (GatewaySettings.session_expiry_s)
                properties = Properties(PacketTypes.CONNECT)
                properties.SessionExpiryInterval = 3600
            self.client.connect("localhost", port, clean_start=session is None, properties=properties)
            self.client.loop_start()
            assert self.connected.wait(WAIT_S), f"{user}: no CONNACK"

    def _on_connect(self, _c: object, _u: object, _flags: object, code: ReasonCode, _p: object) -> None:
        self.connect_code = code.value
        self.connected.set()

    def subscribe(self, topic: str) -> int:
        """The SUBACK reason code of one subscription (QoS granted, or >= 0x80 refused)."""
        answer: list[int] = []
        done = threading.Event()

        def on_subscribe(_c: object, _u: object, _mid: object, codes: list[ReasonCode], _p: object) -> None:
            answer.extend(code.value for code in codes)
            done.set()

        self.client.on_subscribe = on_subscribe
        self.client.subscribe(topic, qos=1)
        assert done.wait(WAIT_S), f"no SUBACK for {topic}"
        return answer[0]

    def publish(self, topic: str, payload: bytes) -> int:
        """The PUBACK reason code of one QoS 1 publish."""
        answer: list[int] = []
        done = threading.Event()

        def on_publish(_c: object, _u: object, _mid: object, code: ReasonCode, _p: object) -> None:
            answer.append(code.value)
            done.set()

        self.client.on_publish = on_publish
        self.client.publish(topic, payload, qos=1)
        assert done.wait(WAIT_S), f"no PUBACK for {topic}"
        return answer[0]

    def publish_many(self, topic: str, payloads: list[bytes]) -> None:
        """QoS 1 publishes, returning once the broker acknowledged every one."""
        acked = threading.Semaphore(0)
        self.client.on_publish = lambda *_args: acked.release()
        for payload in payloads:
            self.client.publish(topic, payload, qos=1)
        for _ in payloads:
            assert acked.acquire(timeout=WAIT_S), "the broker stopped acknowledging"

    def wait_for(self, payload: bytes) -> list[tuple[str, bytes]]:
        """Messages received up to and including ``payload`` (which must arrive)."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if any(p == payload for _t, p in self.received):
                return list(self.received)
            time.sleep(0.02)
        raise AssertionError(f"{payload!r} did not arrive; got {self.received}")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def gateway(broker: Broker) -> Iterator[Client]:
    """The gateway's account, subscribed to all telemetry as the gateway is."""
    client = Client(broker, "iotwatch")
    assert client.subscribe("iot/+/+/+/telemetry") == 1
    yield client
    client.close()


@pytest.fixture
def device(broker: Broker) -> Iterator[Client]:
    client = Client(broker, D1[2])
    yield client
    client.close()


def marker() -> bytes:
    return uuid.uuid4().hex.encode()


def test_device_publishes_its_own_telemetry_and_status(gateway: Client, device: Client) -> None:
    payload = marker()
    assert device.publish(device_topics.telemetry_topic(*D1), payload) == 0
    assert (device_topics.telemetry_topic(*D1), payload) in gateway.wait_for(payload)
    assert (
        device.publish(
            device_topics.status_topic(*D1), device_topics.status_payload(device_topics.DeviceStatus.ONLINE, 0)
        )
        in ACCEPTED
    )


@pytest.mark.parametrize(
    "topic",
    [
        device_topics.telemetry_topic(*D2),  # another device
        device_topics.telemetry_topic("home-2", D1[1], D1[2]),  # its own id under another site
        device_topics.telemetry_topic(D1[0], "smart_meter", D1[2]),  # ... or another type
        device_topics.command_topic(*D2),  # a command to another device
    ],
)
def test_device_cannot_publish_as_another_device(broker: Broker, gateway: Client, device: Client, topic: str) -> None:
    denied, allowed = marker(), marker()
    assert device.publish(topic, denied) == NOT_AUTHORIZED
    # Delivery is in order on one connection: once the allowed message is in, a refused
    # one that mosquitto had let through would be in too.
    assert device.publish(device_topics.telemetry_topic(*D1), allowed) == 0
    assert all(payload != denied for _topic, payload in gateway.wait_for(allowed))


@pytest.mark.parametrize("user", ["iotwatch", "responder"])
def test_services_cannot_write_readings(broker: Broker, gateway: Client, user: str) -> None:
    """The gateway reads and the responder commands; neither can forge a device's reading."""
    service, device = Client(broker, user), Client(broker, D1[2])
    try:
        forged, real = marker(), marker()
        assert service.publish(device_topics.telemetry_topic(*D1), forged) == NOT_AUTHORIZED
        assert service.publish(device_topics.status_topic(*D1), forged) == NOT_AUTHORIZED
        assert device.publish(device_topics.telemetry_topic(*D1), real) == 0
        assert all(payload != forged for _topic, payload in gateway.wait_for(real))
    finally:
        service.close()
        device.close()


def test_device_cannot_read_other_devices(broker: Broker, device: Client) -> None:
    # mosquitto 2.0's ACL file grants every SUBSCRIBE (the SUBACK says nothing) and checks
    # read access on each delivery: what counts is that nothing of another device arrives.
    for topic in (
        device_topics.command_topic(*D2),
        device_topics.telemetry_topic(*D2),
        device_topics.status_topic(*D2),
        "iot/+/+/+/commands",
        "iot/#",
        "#",
    ):
        device.subscribe(topic)
    other, responder = Client(broker, D2[2]), Client(broker, "responder")
    try:
        assert other.subscribe(device_topics.command_topic(*D2)) == 1
        theirs = [marker() for _ in range(3)]
        assert responder.publish(device_topics.command_topic(*D2), theirs[0]) in ACCEPTED
        assert other.publish(device_topics.telemetry_topic(*D2), theirs[1]) in ACCEPTED
        assert other.publish(device_topics.status_topic(*D2), theirs[2]) in ACCEPTED
        assert (device_topics.command_topic(*D2), theirs[0]) in other.wait_for(theirs[0])
        # The broker routed those before it took the next publish: once the device's own
        # command is in, anything of the other device routed to it would be in too.
        own = marker()
        assert responder.publish(device_topics.command_topic(*D1), own) in ACCEPTED
        received = device.wait_for(own)  # once per matching subscription
        assert set(received) == {(device_topics.command_topic(*D1), own)}, received
    finally:
        other.close()
        responder.close()


def test_only_operators_publish_commands(broker: Broker, device: Client) -> None:
    assert device.subscribe(device_topics.command_topic(*D1)) == 1
    responder, gateway, simulator, other = (
        Client(broker, user) for user in ("responder", "iotwatch", "simulator", D2[2])
    )
    try:
        refused = [marker() for _ in range(3)]
        assert gateway.publish(device_topics.command_topic(*D1), refused[0]) == NOT_AUTHORIZED
        assert simulator.publish(device_topics.command_topic(*D1), refused[1]) == NOT_AUTHORIZED
        assert other.publish(device_topics.command_topic(*D1), refused[2]) == NOT_AUTHORIZED
        command = marker()
        assert responder.publish(device_topics.command_topic(*D1), command) == 0
        received = device.wait_for(command)
        assert (device_topics.command_topic(*D1), command) in received
        assert not set(refused) & {payload for _topic, payload in received}
        # The device answers on its ack topic, which the responder reads.
        assert responder.subscribe(device_topics.command_ack_topic(*D1)) == 1
        reply = marker()
        assert device.publish(device_topics.command_ack_topic(*D1), reply) == 0
        assert (device_topics.command_ack_topic(*D1), reply) in responder.wait_for(reply)
        # ... and reports its twin properties on its own twin topic, which no other device may write
        assert responder.subscribe(device_topics.twin_reported_topic(*D1)) == 1
        forged, report = marker(), marker()
        assert other.publish(device_topics.twin_reported_topic(*D1), forged) == NOT_AUTHORIZED
        assert device.publish(device_topics.twin_reported_topic(*D1), report) == 0
        received = responder.wait_for(report)
        assert (device_topics.twin_reported_topic(*D1), report) in received
        assert forged not in {payload for _topic, payload in received}
    finally:
        for client in (responder, gateway, simulator, other):
            client.close()


@pytest.mark.parametrize(
    "user, password", [(D1[2], "wrong-password"), ("iotwatch", "wrong-password"), ("nobody", "whatever"), (D1[2], "")]
)
def test_wrong_password_is_refused(broker: Broker, user: str, password: str) -> None:
    client = Client(broker, user, password=password)
    try:
        assert client.connect_code in (0x86, NOT_AUTHORIZED), f"{user} connected with a wrong password"
    finally:
        client.close()


def test_tls_listener_accepts_clients_trusting_the_ca(broker: Broker, gateway: Client) -> None:
    client = Client(broker, D1[2], tls_ca=broker.folder / "tls" / "ca.crt")
    try:
        assert client.connect_code == 0
        payload = marker()
        assert client.publish(device_topics.telemetry_topic(*D1), payload) == 0
        assert (device_topics.telemetry_topic(*D1), payload) in gateway.wait_for(payload)
    finally:
        client.close()


def test_tls_listener_refuses_clients_not_trusting_the_ca(broker: Broker) -> None:
    untrusting = Client(broker, D1[2], connect=False)  # the system's CAs only
    with pytest.raises(ssl.SSLCertVerificationError):
        untrusting.client.connect("localhost", broker.tls_port)
    stranger = broker.folder / "other-ca"
    iotwatch("provision", "tls", "--out", str(stranger), "--host", "localhost", "--kafka-out", str(stranger))
    with pytest.raises(ssl.SSLCertVerificationError):
        Client(broker, D1[2], tls_ca=stranger / "ca.crt")


def test_reprovisioning_keeps_passwords_and_rotate_changes_them(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.csv"
    fleet.write_text(f"site,device_type,device_id\n{','.join(D1)}\n{','.join(D2)}\n")
    out = tmp_path / "out"
    iotwatch("provision", "mqtt", "--fleet", str(fleet), "--out", str(out))
    first = json.loads((out / "devices" / f"{D1[2]}.json").read_text())["password"]
    fleet.write_text(f"site,device_type,device_id\n{','.join(D1)}\n")
    summary = json.loads(
        iotwatch("provision", "mqtt", "--fleet", str(fleet), "--out", str(out), "--json", stdout_only=True)
    )
    assert (summary["kept"], summary["removed"]) == (1, 1)
    assert json.loads((out / "devices" / f"{D1[2]}.json").read_text())["password"] == first
    assert not (out / "devices" / f"{D2[2]}.json").exists()
    iotwatch("provision", "mqtt", "--fleet", str(fleet), "--out", str(out), "--rotate")
    assert json.loads((out / "devices" / f"{D1[2]}.json").read_text())["password"] != first
    assert {oct(path.stat().st_mode & 0o777) for path in (out / "passwd", out / "acl", *out.glob("devices/*"))} == {
        "0o600"
    }


@pytest.mark.parametrize(
    "content, message",
    [
        ("site,device_id\nhome-1,x\n", "header must be site,device_type,device_id"),
        ("site,device_type,device_id\nhome-1,a:b,x\n", "fleet.csv:2"),
        ("site,device_type,device_id\nhome-1,thermostat,a/b\n", "fleet.csv:2"),
        ("site,device_type,device_id\nhome-1,thermostat,a:b\n", "must not contain ':'"),
        ("site,device_type,device_id\nh,t,x\nh,t,x\n", "listed twice"),
        ("site,device_type,device_id\n", "lists no devices"),
        ("", "is empty (header: site,device_type,device_id)"),
        ("site,device_type,device_id\nh,t,x,extra\n", "fleet.csv:2"),
        ("site,device_type,device_id\nh,t\n", "fleet.csv:2"),
    ],
)
def test_bad_fleet_file_is_one_line_error(tmp_path: Path, content: str, message: str) -> None:
    fleet = tmp_path / "fleet.csv"
    fleet.write_text(content)
    result = subprocess.run(
        [*IOTWATCH, "provision", "mqtt", "--fleet", str(fleet), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "out").exists()


def test_gateway_session_queue_outlasts_the_default_and_a_broker_restart(broker: Broker) -> None:
    """The gateway is away (a Kafka outage) while a device publishes 5,000 readings, five
    times mosquitto's default queue of 1,000; the broker restarts in between. Every reading
    the broker acknowledged reaches the gateway when it comes back (mosquitto.conf's
    max_queued_messages and persistence)."""
    session = f"gateway-{uuid.uuid4().hex[:8]}"
    gateway = Client(broker, "iotwatch", session=session)
    assert gateway.subscribe(device_topics.telemetry_topic(*D1)) == 1
    gateway.close()
    device = Client(broker, D1[2])
    payloads = [f"{seq:05d}".encode() for seq in range(5000)]
    try:
        device.publish_many(device_topics.telemetry_topic(*D1), payloads)
    finally:
        device.close()
    broker.stop()
    broker.start()
    gateway = Client(broker, "iotwatch", session=session)
    try:
        received = gateway.wait_for(payloads[-1])
        assert [payload for _topic, payload in received] == payloads
    finally:
        gateway.close()


def test_the_simulator_account_runs_the_real_simulator(broker: Broker, gateway: Client) -> None:
    """The shared simulator account is enough for `iotwatch simulate` (telemetry, retained
    status, its connection wills): every reading it sends reaches the gateway's account."""
    env = user_env()
    env.update(
        IOTWATCH_MQTT_USERNAME="simulator", IOTWATCH_MQTT_PASSWORD=broker.passwords["simulator"], IOTWATCH_INFLUX_URL=""
    )
    stdout = iotwatch(
        "simulate",
        "--mqtt",
        f"mqtt://127.0.0.1:{broker.port}",
        "--homes",
        "1",
        "--vehicles",
        "0",
        "--count",
        "30",
        "--as-fast-as-possible",
        "--no-progress",
        "--json",
        env=env,
        stdout_only=True,
    )
    sent = json.loads(stdout[stdout.rfind("\n{") + 1 :])["sent"]
    deadline = time.monotonic() + WAIT_S
    while len(gateway.received) < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(gateway.received) == sent >= 30, (sent, len(gateway.received))


@pytest.mark.parametrize("command", [["tls"], ["mqtt", "--fleet", "fleet.csv"]])
def test_default_folders_only_from_the_repository_root(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "fleet.csv").write_text(f"site,device_type,device_id\n{','.join(D1)}\n")
    result = subprocess.run(
        [*IOTWATCH, "provision", *command], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "iotwatch: error: deploy/mosquitto does not exist here: run from the repository root or pass --out"
    ]
    assert [path.name for path in tmp_path.iterdir()] == ["fleet.csv"]
