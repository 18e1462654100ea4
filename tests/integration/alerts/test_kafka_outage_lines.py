"""``alerts tail``, ``alerts forward``, ``respond`` and the gateway through a Kafka outage:
each says once that it lost the broker and once that it answers again.

A stack of its own (its Kafka is stopped and started; MQTT for the responder and the
gateway), the commands as a user runs them, logging to a pipe.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from iotwatch.application.stack import EmbeddedStack
from iotwatch.application.stack.process import free_port
from iotwatch.settings import Settings
from tests.helpers import user_env, wait_for
from tests.support.alerts import FlakyWebhook

pytestmark = pytest.mark.slow

#: A lost broker: librdkafka's summarised line, or the gateway's own.
LOST = ("(retrying; repeats are logged at DEBUG)", "unreachable")
#: A broker back: "answers again" (librdkafka's statistics), or the gateway's "Kafka ... answers".
BACK = ("answers",)


class Command:
    """A command run as a user runs it, its stderr collected line by line."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.process = subprocess.Popen(
            [sys.executable, "-m", "iotwatch.application", *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip())

    def count(self, texts: tuple[str, ...]) -> int:
        return sum(any(text in line for text in texts) for line in list(self.lines))

    def said(self, *texts: str) -> Callable[[], bool]:
        return lambda: self.count(texts) > 0

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        self.thread.join(timeout=5)
        return code


def test_tail_forward_respond_and_the_gateway_say_once_that_kafka_is_gone_and_once_that_it_is_back(
    base_settings: Settings, tmp_path: Path
) -> None:
    base = base_settings.model_copy(update={"stack": base_settings.stack.model_copy(update={"influxdb": "none"})})
    embedded = EmbeddedStack(base, tmp_path / "stack")
    state = embedded.up()
    hook = FlakyWebhook(fail_every=0, retry_after_at=None, stall_at=None)
    server, url = hook.serve()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**user_env(home=tmp_path / "home"), **state.env()}
    started = {
        "tail": "alerts tail: following",
        "forward": "alerts forward: state rebuilt",
        "respond": "respond: following",
        "gateway": " answers",  # its first check of Kafka: "Kafka ... answers"
    }
    commands = {
        "tail": Command(["alerts", "tail", "--plain"], env),
        "forward": Command(["alerts", "forward", "--webhook", url, "--state-dir", str(tmp_path / "fwd")], env),
        "respond": Command(["respond"], env),
        "gateway": Command(["gateway"], {**env, "IOTWATCH_GATEWAY_METRICS_PORT": str(free_port())}),
    }
    codes: dict[str, int] = {}
    try:
        for name, command in commands.items():
            wait_for(command.said(started[name]), 60, f"{name} started")
        started_lines = {name: command.count(BACK) for name, command in commands.items()}
        assert embedded.stop_service("kafka")
        for name, command in commands.items():
            wait_for(command.said(*LOST), 30, f"{name} saying Kafka is gone")
        time.sleep(5)  # reconnect attempts keep failing meanwhile
        assert embedded.start_service("kafka")
        for name, command in commands.items():
            wait_for(command.said(*BACK), 45, f"{name} saying Kafka answers again")
        time.sleep(2)  # clients that reconnect later say nothing more
    finally:
        for name, command in commands.items():
            codes[name] = command.stop()
        server.shutdown()
        server.server_close()
        embedded.down()
    for name, command in commands.items():
        shown = "\n".join(command.lines)
        assert codes[name] == 0, (name, shown)
        assert (command.count(LOST), command.count(BACK) - started_lines[name]) == (1, 1), (name, shown)
