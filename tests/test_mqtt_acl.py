"""The MQTT access control of the deployment, on a real mosquitto with the password file and
ACL that deploy/mosquitto/entrypoint.sh generates: only the responder's (operators') account
publishes commands; a device account uses its own topics only; the simulator's account may
reply to commands but not send them. A missing mosquitto fails, it is not skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from iotwatch.stack.process import free_port, port_open, start_process, stop_process, wait_until

REPO = Path(__file__).resolve().parent.parent
ACCOUNTS = {"MQTT_USERNAME": "iotwatch", "MQTT_RESPONDER_USERNAME": "responder", "MQTT_DEVICE_USERNAME": "simulator"}
D1, D2 = "home-1-leak_sensor-0", "home-1-thermostat-0"  # devices with their own accounts
TOPIC = {D1: "iot/home-1/leak_sensor/home-1-leak_sensor-0", D2: "iot/home-1/thermostat/home-1-thermostat-0"}


def password(user: str) -> str:
    return f"pw-{user}"


@pytest.fixture(scope="module")
def broker() -> Iterator[int]:
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    assert Path(binary).exists(), "mosquitto is not installed (bootstrap.sh installs it)"
    # the broker reads the files as user mosquitto: a folder it can reach, not pytest's 0700 tmp
    folder = Path(tempfile.mkdtemp(prefix="iotwatch-acl-"))
    folder.chmod(0o711)
    env = {**os.environ, "MQTT_AUTH_DIR": str(folder / "auth"),
           **{key: user for key, user in ACCOUNTS.items()},
           **{key.replace("USERNAME", "PASSWORD"): password(user) for key, user in ACCOUNTS.items()}}
    subprocess.run(["sh", str(REPO / "deploy/mosquitto/entrypoint.sh"), "true"], env=env, check=True)
    for device in (D1, D2):  # per-device accounts are added the same way by an operator
        subprocess.run(["mosquitto_passwd", "-b", str(folder / "auth/passwd"), device, password(device)], check=True)
    port = free_port()
    conf = folder / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {folder}/auth/passwd\n"
                    f"acl_file {folder}/auth/acl\npersistence false\nlog_dest stdout\n")
    conf.chmod(0o644)
    record = start_process("mosquitto-acl", [binary, "-c", str(conf)], folder / "mosquitto.log")
    try:
        wait_until(lambda: port_open("127.0.0.1", port), timeout_s=15, what="mosquitto with ACL", record=record)
        yield port
    finally:
        stop_process(record)
        shutil.rmtree(folder, ignore_errors=True)


class Client:
    """One account's connection, recording what it receives."""

    def __init__(self, port: int, user: str, subscriptions: tuple[str, ...] = ()) -> None:
        self.received: list[tuple[str, bytes]] = []
        self.granted: list[int] = []
        ready = threading.Event()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"acl-{user}-{time.monotonic_ns()}")
        self.client.username_pw_set(user, password(user))
        self.client.on_message = lambda _c, _u, m: self.received.append((m.topic, m.payload))

        def on_subscribe(_c: object, _u: object, _mid: object, codes: list[object], _p: object) -> None:
            self.granted = [int(getattr(code, "value", code)) for code in codes]
            ready.set()

        self.client.on_subscribe = on_subscribe
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        if subscriptions:
            self.client.subscribe([(topic, 1) for topic in subscriptions])
            assert ready.wait(10), f"{user}: no SUBACK"

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(10)

    def topics(self) -> set[str]:
        return {topic for topic, _ in self.received}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_only_the_responder_commands_and_devices_keep_to_their_own_topics(broker: int) -> None:
    d1 = Client(broker, D1, (f"{TOPIC[D1]}/commands",))
    d1_snoop = Client(broker, D1, (f"{TOPIC[D2]}/commands", "iot/#"))
    d2 = Client(broker, D2, (f"{TOPIC[D2]}/commands",))
    responder = Client(broker, "responder", ("iot/+/+/+/commands/ack", "iot/+/+/+/commands"))
    gateway = Client(broker, "iotwatch", ("iot/+/+/+/telemetry",))
    simulator = Client(broker, "simulator", ("iot/+/+/+/commands",))
    clients = [d1, d1_snoop, d2, responder, gateway, simulator]
    try:
        # commands: the responder's reach the device (and the simulator, which serves many devices)
        responder.publish(f"{TOPIC[D1]}/commands", b"from responder")
        # nobody else's: not a device for another device, not the simulator, not the services account
        d1.publish(f"{TOPIC[D2]}/commands", b"from d1")
        simulator.publish(f"{TOPIC[D2]}/commands", b"from simulator")
        gateway.publish(f"{TOPIC[D2]}/commands", b"from gateway")
        # replies and telemetry: a device on its own topics only
        d1.publish(f"{TOPIC[D1]}/commands/ack", b"d1 ack")
        d1.publish(f"{TOPIC[D2]}/commands/ack", b"forged ack")
        d1.publish(f"{TOPIC[D1]}/telemetry", b"d1 reading")
        d1.publish(f"{TOPIC[D2]}/telemetry", b"forged reading")
        simulator.publish(f"{TOPIC[D2]}/commands/ack", b"simulator ack")
        time.sleep(1.0)

        assert d1.received == [(f"{TOPIC[D1]}/commands", b"from responder")]
        assert d2.received == []  # no command from anyone but the responder
        assert simulator.received == [(f"{TOPIC[D1]}/commands", b"from responder")]
        # subscribed to another device's commands and to iot/#: still only what is its own
        assert d1_snoop.received == [(f"{TOPIC[D1]}/commands", b"from responder")]
        # replies from the device on its own topic and from the simulator; not the forged one
        assert sorted(p for _, p in responder.received) == [b"d1 ack", b"simulator ack"]
        assert gateway.received == [(f"{TOPIC[D1]}/telemetry", b"d1 reading")]
    finally:
        for client in clients:
            client.close()


def test_a_wrong_password_is_refused(broker: int) -> None:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="acl-wrong")
    client.username_pw_set("responder", "not the password")
    refused = threading.Event()
    client.on_connect = lambda _c, _u, _f, reason, _p: refused.set() if reason.is_failure else None
    client.connect("127.0.0.1", broker)
    client.loop_start()
    try:
        assert refused.wait(10)
    finally:
        client.loop_stop()
