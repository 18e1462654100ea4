"""The MQTT broker: mosquitto when installed, else the pip-installed amqtt broker."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from iotwatch.application.stack.process import free_port, start_process, wait_until
from iotwatch.application.stack.service import RunningService
from iotwatch.clients.mqtt import round_trip
from iotwatch.errors import StackError
from iotwatch.settings import MqttSettings

HOST = "127.0.0.1"


def start_mqtt_broker(run_dir: Path, choice: str, timeout_s: float, port: int | None = None) -> RunningService:
    """Start the broker chosen by ``choice`` (auto, mosquitto, amqtt) and wait until a
    real client completes a publish/subscribe round trip through it. ``port``: a fixed one
    (to restart a broker where its clients expect it), else a free one."""
    mosquitto = shutil.which("mosquitto") or _debian_sbin("mosquitto")
    if choice == "mosquitto" and not mosquitto:
        raise StackError(
            "mosquitto is not installed: apt-get install -y mosquitto mosquitto-clients "
            "(or set IOTWATCH_STACK_MQTT_BROKER=amqtt)"
        )
    port = port or free_port(HOST)
    base = run_dir / "mqtt"
    base.mkdir(parents=True, exist_ok=True)
    if mosquitto and choice != "amqtt":
        command, implementation = _mosquitto_command(mosquitto, base, port), "mosquitto"
    else:
        command, implementation = _amqtt_command(base, port), "amqtt"
    record = start_process("mqtt", command, base / "broker.log")
    endpoint = f"mqtt://{HOST}:{port}"
    settings = MqttSettings(url=endpoint)

    def answers() -> bool:
        round_trip(settings, timeout_s=2.0)  # raises until the broker answers
        return True

    wait_until(
        answers,
        timeout_s=timeout_s,
        what=f"MQTT broker ({implementation}) on port {port}",
        record=record,
    )
    return RunningService("mqtt", implementation, endpoint, record)


def _debian_sbin(name: str) -> str | None:
    """Debian installs mosquitto in /usr/sbin, which is not on every user's PATH."""
    candidate = Path("/usr/sbin") / name
    return str(candidate) if candidate.exists() else None


def _mosquitto_command(binary: str, base: Path, port: int) -> list[str]:
    # Anonymous access on loopback only: the embedded stack is a single-user dev stack
    # (docker-compose runs mosquitto with a password file and ACLs). ``user root``: as root,
    # mosquitto would drop to a user that cannot write the run folder (docs/operate/gateway.md).
    conf = base / "mosquitto.conf"
    conf.write_text(
        f"listener {port} {HOST}\n"
        f"{'user root' if os.geteuid() == 0 else ''}\n"
        "allow_anonymous true\n"
        "persistence true\n"
        f"persistence_location {base}/\n"
        "autosave_interval 5\n"
        "max_queued_messages 1000000\n"
        "max_inflight_messages 1000\n"
        "log_dest stdout\n"
        "log_type error\nlog_type warning\nlog_type notice\n"
    )
    return [binary, "-c", str(conf)]


def _amqtt_command(base: Path, port: int) -> list[str]:
    conf = base / "amqtt.yaml"
    conf.write_text(
        "listeners:\n"
        "  default:\n"
        "    type: tcp\n"
        f"    bind: {HOST}:{port}\n"
        "plugins:\n"
        "  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
        "    allow_anonymous: true\n"
    )
    amqtt = shutil.which("amqtt", path=str(Path(sys.executable).parent)) or shutil.which("amqtt")
    if not amqtt:
        raise StackError("the amqtt broker is not installed: pip install amqtt (or install mosquitto)")
    return [amqtt, "-c", str(conf)]
