"""Several gateway processes on one MQTT shared subscription (``iotwatch gateway --processes N``); one
that dies is started again with the same client id, so a crash costs duplicates, never loss
(docs/operate/gateway.md, "Scaling out")."""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from iotwatch.cli import stop_on_signals
from iotwatch.settings import Settings

log = logging.getLogger(__name__)

#: A process is started again at most this often.
_MIN_LIFETIME_S = 5.0
#: Summary fields that add up over processes.
_SUMMED = (
    "received",
    "forwarded",
    "dead_lettered",
    "delivery_failures",
    "duplicates",
    "seq_gaps",
    "devices_forgotten",
    "inflight",
    "tracked_devices",
)


def instance_settings(settings: Settings, index: int) -> Settings:
    """Process ``index``'s settings: its own client id and metrics port, the shared group."""
    config = settings.gateway
    port = config.metrics_port
    if port:  # 0 (a free port) and None (no server) stay as they are
        port += index
    return settings.model_copy(
        update={
            "gateway": config.model_copy(
                update={
                    "client_id": f"{config.client_id}-{index}",
                    "shared_group": config.shared_group or config.client_id,
                    "metrics_port": port,
                    "processes": 1,
                }
            )
        }
    )


def serve(settings: Settings, stop: threading.Event) -> dict[str, Any]:
    """Run one gateway until ``stop`` is set; its final counts."""
    from iotwatch.gateway.bridge import Gateway

    bridge = Gateway(settings)
    bridge.start()
    if bridge.metrics_port is not None:
        log.info(
            "metrics on http://%s:%d/metrics, health on /health", settings.gateway.metrics_host, bridge.metrics_port
        )
    bridge.run(stop)
    log.info("stopping %s: draining in-flight messages", settings.gateway.client_id)
    return bridge.stop(drain=True)


def _child(settings: Settings, log_level: int, results: Connection) -> None:
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    results.send(serve(settings, stop_on_signals()))
    results.close()


class Supervisor:
    """Starts the processes, restarts one that dies, stops them all on ``stop``."""

    def __init__(self, settings: Settings, processes: int) -> None:
        self.settings = settings
        self.processes = processes
        self.restarts = 0
        self._context = multiprocessing.get_context("spawn")  # no inherited threads or sockets
        self._children: dict[int, tuple[Any, Connection]] = {}

    def _start(self, index: int) -> None:
        receiver, sender = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=_child,
            name=f"gateway-{index}",
            daemon=False,
            args=(instance_settings(self.settings, index), logging.getLogger().getEffectiveLevel(), sender),
        )
        process.start()
        sender.close()
        self._children[index] = (process, receiver)
        log.info("gateway process %d started (pid %d)", index, process.pid)

    def run(self, stop: threading.Event) -> dict[str, Any]:
        started: dict[int, float] = {}
        for index in range(self.processes):
            self._start(index)
            started[index] = time.monotonic()
        while not stop.wait(0.5):
            for index, (process, _results) in list(self._children.items()):
                if process.is_alive() or time.monotonic() - started[index] < _MIN_LIFETIME_S:
                    continue  # one that died right after starting (e.g. no broker) is not restarted in a loop
                log.error(
                    "gateway process %d (pid %d) exited with %s: starting it again (its session keeps "
                    "what it had not acknowledged)",
                    index,
                    process.pid,
                    process.exitcode,
                )
                self.restarts += 1
                self._start(index)
                started[index] = time.monotonic()
        return self._stop_all()

    def _stop_all(self) -> dict[str, Any]:
        for process, _ in self._children.values():
            if process.is_alive():
                process.terminate()  # SIGTERM: the child drains, then reports
        summaries = []
        for index, (process, results) in sorted(self._children.items()):
            deadline = time.monotonic() + self.settings.gateway.drain_timeout_s + 15
            summary: dict[str, Any] = {"client_id": f"{self.settings.gateway.client_id}-{index}"}
            if results.poll(max(0.0, deadline - time.monotonic())):
                try:
                    summary.update(results.recv())
                except EOFError:
                    summary["error"] = "exited without a summary"
            process.join(max(0.0, deadline - time.monotonic()))
            summary["exitcode"] = process.exitcode
            summaries.append(summary)
        total: dict[str, Any] = {name: sum(int(s.get(name) or 0) for s in summaries) for name in _SUMMED}
        reasons: dict[str, int] = {}
        for s in summaries:
            for reason, count in (s.get("dead_letter_reasons") or {}).items():
                reasons[reason] = reasons.get(reason, 0) + count
        total.update(dead_letter_reasons=reasons, processes=self.processes, restarts=self.restarts, instances=summaries)
        return total
