"""Starting a run's pipeline on the embedded stack and waiting for its job (docs/internals.md, "Harness
pipeline")."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka import Message

from iotwatch.application.harness.probe import Sample
from iotwatch.application.stack.embedded import StackState
from iotwatch.application.stack.process import Component
from iotwatch.contract.alerts import AlertRecord, BadAlert, decode_alert
from iotwatch.errors import IotwatchError

log = logging.getLogger(__name__)

#: Variables of the caller the components keep: where `iotwatch setup` put the Java artifacts.
KEPT_VARIABLES = ("IOTWATCH_JARS_DIR",)

#: Seconds the job must stay caught up with its input before a drain counts as done: a
#: micro-batch may still be planned on records the probe has not seen appended yet.
CAUGHT_UP_FOR_S = 8.0


def iotwatch_command(*args: str) -> list[str]:
    """An ``iotwatch`` command line run by this Python (the run's components)."""
    return [sys.executable, "-m", "iotwatch.application", "--log-level", "WARNING", *args]


def option_args(valued: Mapping[str, object]) -> list[str]:
    """``--option value`` pairs of a command line, in order; an option valued None is left out."""
    return [str(part) for option, value in valued.items() if value is not None for part in (option, value)]


def component_env(state: StackState, out: Path, *, silence_timeout_s: float) -> dict[str, str]:
    """The components' environment: this one without the caller's IOTWATCH_* settings (but
    where the Java artifacts are), the stack's endpoints, and the job's checkpoint, archive
    and registry in the run folder ``out`` (``checkpoint``, ``archive``, ``registry``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOTWATCH_") or k in KEPT_VARIABLES}
    env.update(state.env())
    env.update(
        IOTWATCH_STREAM_CHECKPOINT_DIR=str(out / "checkpoint"),
        IOTWATCH_STREAM_ARCHIVE_DIR=str(out / "archive"),
        IOTWATCH_STREAM_SILENCE_TIMEOUT_S=str(silence_timeout_s),
        IOTWATCH_REGISTRY_PATH=str(out / "registry"),
    )
    return env


def gateway_command(client_id: str, metrics_port: int) -> list[str]:
    """The gateway of a run: its client id is its instance tag in InfluxDB."""
    return iotwatch_command("gateway", "--client-id", client_id, "--metrics-port", str(metrics_port), "--json")


def wait_for_stream(stream: Component, checkpoint: Path, timeout_s: float = 180.0) -> None:
    """Until the streaming query has committed its first micro-batch (on an empty raw topic
    a batch of no records, run as soon as the query starts), so the devices do not publish
    into a backlog while Spark starts and plans its first batch on Kafka (about 2 s on two
    cores, after the job's warm-up): alerts then come about as late as the trigger makes
    them, not after the start-up's backlog."""
    deadline = time.monotonic() + timeout_s
    while not (checkpoint / "commits" / "0").exists():
        if not stream.running():
            raise IotwatchError(f"the streaming job ended while starting: see {stream.log_path}")
        if time.monotonic() > deadline:
            raise IotwatchError(f"the streaming job did not start within {timeout_s:.0f} s: see {stream.log_path}")
        time.sleep(0.2)


class CatchUp:
    """Whether the job has processed its whole input and stayed so for :data:`CAUGHT_UP_FOR_S`:
    the gateways hold nothing in flight, the centre has every record the sites hold (with
    sites), and the job's newest committed batch reached the raw topics' end (and what the
    gateways forwarded: with one cluster the gateway is the raw topic's only producer)."""

    def __init__(self, hold_s: float = CAUGHT_UP_FOR_S) -> None:
        self.hold_s = hold_s
        self._since: float | None = None

    def update(self, sample: Sample) -> bool:
        forwarded = int(sample.gateway.get("forwarded", 0))  # readings only: dead letters are not on the raw topic
        idle = (
            sample.gateway.get("inflight", 1) == 0
            and sample.raw_end >= sample.edge_end
            and sample.stream_offset >= max(forwarded, sample.raw_end) > 0
        )
        self._since = (self._since or time.monotonic()) if idle else None
        return self._since is not None and time.monotonic() - self._since >= self.hold_s


def decoded_alerts(records: list[Message]) -> tuple[list[AlertRecord], list[Message]]:
    """The alert topic's alerts, and their Kafka records; a record that is not an alert is
    logged and left out (the forwarder dead-letters it)."""
    alerts, kept = [], []
    for record in records:
        try:
            alerts.append(decode_alert(record.value()))
            kept.append(record)
        except BadAlert as exc:
            log.warning("not an alert at %s@%d: %s", record.topic(), record.offset(), exc)
    return alerts, kept
