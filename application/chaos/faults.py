"""Injecting the schedule's faults into the running system and timing each recovery: a killed
target is started again after its hold, as a supervisor would, a paused one continued, and
the next fault waits until data flows end to end again (:class:`Recovery`; the conditions are
listed in docs/operate/chaos.md), so each recovery time is the fault's own.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import requests
from confluent_kafka import Consumer, KafkaException, TopicPartition

from iotwatch.application.chaos.schedule import SERVICES, Action, PlannedFault
from iotwatch.application.harness.probe import Probe
from iotwatch.application.stack.embedded import EmbeddedStack, StackState
from iotwatch.application.stack.process import Component
from iotwatch.clients.kafka import client_config, end_offset
from iotwatch.gateway.metrics import scrape
from iotwatch.settings import Settings

log = logging.getLogger(__name__)

#: A fault has not recovered while the gateway holds a message Kafka has not confirmed for
#: longer than this: the MQTT broker still keeps it, and the next fault would strike two
#: components at once (a kill -9 of mosquitto loses what it has not saved yet).
CONFIRMED_WITHIN_S = 5.0

#: A fault has not recovered while the newest reading the gateway received is older than this
#: (event time): the MQTT broker still holds a backlog for the gateway, in memory until its
#: next save, and a kill -9 of it would lose what it had acknowledged to the devices.
BEHIND_WITHIN_S = 2.0

#: How long a Ctrl-C'd component may take to stop: the job finishes or abandons its micro-batch,
#: then waits for its Spark JVM, which may first write its class-data archive
#: (:data:`iotwatch.jvm.spark.JVM_EXIT_WAIT_S`).
INTERRUPT_WAIT_S = 180.0


@dataclass
class FaultRecord:
    """What happened to one planned fault, in seconds since the load started."""

    planned: PlannedFault
    injected_s: float | None = None
    restored_s: float | None = None  # the target running (or continued) again
    recovered_s: float | None = None
    exit_status: int | None = None  # a Ctrl-C'd component's exit status (0: a clean stop)
    node: str | None = None  # the Kafka node a fault on a cluster acted on
    lag_at_recovery: int | None = None  # records appended to the raw topic and not yet committed by the job
    waiting_for: str | None = None  # a fault that did not recover: the condition still unmet at the timeout
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        def since_injected(t: float | None) -> float | None:
            return None if t is None or self.injected_s is None else round(t - self.injected_s, 1)

        return {
            **self.planned.to_dict(),
            "injected_at_s": None if self.injected_s is None else round(self.injected_s, 1),
            "down_s": since_injected(self.restored_s),
            "recovery_s": since_injected(self.recovered_s),
            "recovered": self.recovered_s is not None,
            "lag_at_recovery": self.lag_at_recovery,
            **({"node": self.node} if self.node else {}),
            **({"exit_status": self.exit_status} if self.exit_status is not None else {}),
            **({"waiting_for": self.waiting_for} if self.waiting_for else {}),
            **({"error": self.error} if self.error else {}),
        }


class Targets:
    """The run's components and the stack's servers, by name, and what faults do to them."""

    def __init__(self, stack: EmbeddedStack, state: StackState, components: dict[str, Component]) -> None:
        self.stack, self.state, self.components = stack, state, components
        self.lock = threading.Lock()  # a restart and the supervisor's check never overlap
        self.turns: dict[str, int] = {}

    def names(self) -> list[str]:
        return [*self.components, *self.state.services]

    def aim(self, target: str) -> str:
        """The process a fault on ``target`` acts on: the component or server itself, or for
        a Kafka cluster its nodes in turn (``kafka``, ``kafka-2``, ...)."""
        nodes = self.state.kafka_nodes if target == "kafka" else []
        if len(nodes) <= 1:
            return target
        turn = self.turns.get(target, 0)
        self.turns[target] = turn + 1
        return nodes[turn % len(nodes)]

    def _server(self, name: str) -> psutil.Process | None:
        return self.state.services[name].process.process()

    def running(self, name: str) -> bool:
        if name in self.components:
            return self.components[name].running()
        return self._server(name) is not None

    def kill(self, name: str) -> None:
        if name in self.components:
            self.components[name].kill()
            return
        proc = self._server(name)
        if proc is not None:
            proc.kill()
            psutil.wait_procs([proc], timeout=30)

    def interrupt(self, name: str) -> int | None:
        """Ctrl-C to the component's process group; its exit status (None: it did not stop,
        and was killed)."""
        component = self.components[name]
        status = component.signal_group(signal.SIGINT, wait_s=INTERRUPT_WAIT_S)
        if status is None:
            component.kill()
        return status

    def start_again(self, name: str) -> None:
        with self.lock:
            if name in self.components:
                self.components[name].restart()
            else:
                self.stack.restart_service(self.state, name)

    def pause(self, name: str) -> None:
        self._group(name).suspend()

    def resume(self, name: str) -> None:
        self._group(name).resume()

    def _group(self, name: str) -> psutil.Process:
        proc = psutil.Process(self.components[name].pid) if name in self.components else self._server(name)
        if proc is None:
            raise RuntimeError(f"{name} is not running")
        return proc

    def trees(self) -> dict[str, tuple[int, list[psutil.Process]]]:
        """Name -> (pid, process and children) of every target running now."""
        found: dict[str, tuple[int, list[psutil.Process]]] = {}
        for name, component in self.components.items():
            tree = component.tree()
            if tree:
                found[name] = (component.pid, tree)
        servers = [role for name in SERVICES for role in (self.state.kafka_nodes if name == "kafka" else [name])]
        for name in servers:
            proc = self._server(name) if name in self.state.services else None
            if proc is not None:
                try:
                    found[name] = (proc.pid, [proc, *proc.children(recursive=True)])
                except psutil.Error:
                    continue
        return found


class Recovery:
    """Whether data flows end to end again (docs/operate/chaos.md lists the conditions)."""

    def __init__(self, settings: Settings, gateway_port: int, probe: Probe) -> None:
        self.settings = settings
        self.health_url = f"http://127.0.0.1:{gateway_port}/health"
        self.metrics_url = f"http://127.0.0.1:{gateway_port}/metrics"
        self.probe = probe
        self.lag = 0  # raw topic records the job had not committed at the last check
        self.unmet = ""  # the first condition the last check found unmet
        self.groups = Consumer(
            {**client_config(settings.kafka), "group.id": settings.alerts.forward_group_id, "enable.auto.commit": False}
        )
        partitions = settings.kafka.partitions
        self.alert_partitions = [TopicPartition(settings.topics.alerts, p) for p in range(partitions)]

    def close(self) -> None:
        self.groups.close()
        self.probe.close()

    def mark(self) -> tuple[int, int]:
        """The raw and alert topics' ends now."""
        return self.probe.raw_end(), self._alert_end()

    def done(self, target: str, mark: tuple[int, int]) -> bool:
        raw_then, alerts_then = mark
        try:
            healthy = requests.get(self.health_url, timeout=1).status_code == 200
        except requests.RequestException:
            healthy = False
        raw_now, processed = self.probe.raw_end(), self.probe.stream_offset()
        self.lag = max(0, raw_now - processed)
        gauges = scrape(self.metrics_url) if healthy else {}
        oldest, behind = gauges.get("oldest_inflight_seconds", 0.0), gauges.get("newest_reading_age_seconds", 0.0)
        if not healthy:
            self.unmet = "the gateway's health check"
        elif oldest > CONFIRMED_WITHIN_S:
            self.unmet = f"Kafka to confirm the gateway's oldest message ({oldest:.0f} s unconfirmed)"
        elif behind > BEHIND_WITHIN_S:
            self.unmet = f"the MQTT broker's backlog for the gateway (newest reading received {behind:.0f} s old)"
        elif raw_now <= raw_then:
            self.unmet = f"the raw topic to grow past {raw_then} records (gateway to Kafka)"
        elif processed < raw_then:
            self.unmet = f"the job to commit offset {raw_then} (committed {processed})"
        elif target == "forward" and (forwarded := self._forwarded()) < alerts_then:
            self.unmet = f"the forwarder to commit alert offset {alerts_then} (committed {forwarded})"
        else:
            self.unmet = ""
        return not self.unmet

    def _alert_end(self) -> int:
        total = 0
        for tp in self.alert_partitions:
            try:
                total += end_offset(self.groups, tp, timeout_s=2.0)
            except KafkaException:  # no mark: the forwarder's recovery is judged by the raw topic alone
                return 0
        return total

    def _forwarded(self) -> int:
        try:
            committed = self.groups.committed(self.alert_partitions, timeout=5.0)
        except Exception:
            return -1
        return sum(max(tp.offset, 0) for tp in committed)


@dataclass
class FaultRunner:
    """Runs the planned faults in order, each after the previous one recovered (a thread)."""

    faults: list[PlannedFault]
    targets: Targets
    recovery: Recovery
    started: float  # time.time() when the load started
    timeout_s: float = 300.0
    records: list[FaultRecord] = field(default_factory=list)
    busy: str | None = None  # the target a fault is acting on (the supervisor leaves it alone)
    stop: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, name="chaos-faults", daemon=True).start()

    def now(self) -> float:
        return time.time() - self.started

    def _run(self) -> None:
        try:
            for planned in self.faults:
                if self.stop.wait(max(0.0, planned.at_s - self.now())):
                    break
                record = FaultRecord(planned)
                self.records.append(record)
                try:
                    self._inject(record)
                except Exception as exc:  # recorded: the run fails on it, the next fault goes on
                    log.warning("fault %s: %s", planned.kind.name, exc)
                    record.error = f"{type(exc).__name__}: {exc}"
                finally:
                    self.busy = None
        finally:
            self.finished.set()

    def _inject(self, record: FaultRecord) -> None:
        kind, target = record.planned.kind, self.targets.aim(record.planned.kind.target)
        record.node = target if len(self.targets.state.kafka_nodes) > 1 and kind.target == "kafka" else None
        self.busy = target
        log.debug("fault: %s (hold %.1f s)", kind.name, record.planned.hold_s)
        record.injected_s = self.now()
        if kind.action is Action.PAUSE:
            self.targets.pause(target)
            self.stop.wait(record.planned.hold_s)
            self.targets.resume(target)
        else:
            if kind.action is Action.INTERRUPT:
                record.exit_status = self.targets.interrupt(target)
            else:
                self.targets.kill(target)
            self.stop.wait(record.planned.hold_s)
            self.targets.start_again(target)
        record.restored_s = self.now()
        self.busy = None
        mark = self.recovery.mark()
        self._await(record, lambda: self.recovery.done(target, mark))

    def _await(self, record: FaultRecord, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline and not self.stop.is_set():
            if check():
                record.recovered_s = self.now()
                record.lag_at_recovery = self.recovery.lag
                return
            time.sleep(0.2)  # on average half of it is counted into the recovery time
        record.waiting_for = self.recovery.unmet or None
