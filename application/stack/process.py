"""Starting, identifying, signalling and stopping the processes iotwatch runs (docs/internals.md,
"Processes")."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from iotwatch.errors import StackError
from iotwatch.jvm import class_data


@dataclass(frozen=True)
class ProcessRecord:
    """What is needed to find a started server again, from another process."""

    name: str
    pid: int
    create_time: float
    command: list[str]
    log_file: str

    def process(self) -> psutil.Process | None:
        """The live process, or None when it has exited (or its pid was reused)."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except psutil.Error:
            return None

    def is_running(self) -> bool:
        return self.process() is not None


def start_process(
    name: str, command: Sequence[str], log_file: Path, *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> ProcessRecord:
    """Start ``command`` detached from this process, stdout and stderr to ``log_file``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        try:
            popen = subprocess.Popen(
                list(command),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise StackError(f"cannot start {name} ({command[0]}): {exc}") from exc
    proc = psutil.Process(popen.pid)
    return ProcessRecord(name, popen.pid, proc.create_time(), list(command), str(log_file))


def restart_process(record: ProcessRecord) -> ProcessRecord:
    """Start a stopped server again with its own command, in the folder of its log (its data
    and configuration beside it)."""
    log_file = Path(record.log_file)
    return start_process(record.name, record.command, log_file, cwd=log_file.parent)


def stop_process(record: ProcessRecord, timeout_s: float = 10.0) -> None:
    """SIGTERM the process and its children, then SIGKILL what is left after ``timeout_s``
    (a JVM that writes its class-data archive as it exits is given the time that takes:
    killed while writing, it would leave an archive no JVM can map)."""
    proc = record.process()
    if proc is None:
        return
    timeout_s = class_data.exit_wait_s(record.command, timeout_s)
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        family = [proc]
    _end_all(family, timeout_s)
    _reap(record.pid)


def _session_members(session: int) -> list[psutil.Process]:
    """The processes still in ``session`` (a component's, started with a session of its own)."""
    members = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != session and os.getsid(proc.pid) == session:
                members.append(proc)
        except (OSError, psutil.Error):
            continue
    return members


def _end_all(procs: list[psutil.Process], timeout_s: float = 10.0) -> None:
    """SIGTERM the processes still running, SIGKILL those left after ``timeout_s``."""
    for proc in (alive := _wait_ended(procs, 0.0)):
        _signal(proc, signal.SIGTERM)
    for proc in (left := _wait_ended(alive, timeout_s)):
        _signal(proc, signal.SIGKILL)
    _wait_ended(left, 5.0)


def _wait_ended(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after ``timeout_s``. A zombie has ended: only its reaping is left,
    and an orphan's (a killed job's JVM) is init's, seconds late in some sandboxes."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in procs if _status(p) not in ("", psutil.STATUS_ZOMBIE)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def _status(proc: psutil.Process) -> str:
    with suppress(psutil.NoSuchProcess):
        return str(proc.status())
    return ""


def _signal(proc: psutil.Process, sig: signal.Signals) -> None:
    with suppress(psutil.Error):
        proc.send_signal(sig)


def _reap(pid: int) -> None:
    """Collect the exit status when the process is our own child (no zombie left)."""
    with suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """A port that is free right now (the OS picks it); with ``count``, the first of that many
    consecutive free ports (``iotwatch gateway --processes N`` serves metrics on N of them:
    the port after an OS-picked one may be another connection's local port)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            first = int(sock.getsockname()[1])
            if count == 1:
                return first
            if first + count - 1 <= 65535 and all(_bindable(host, first + i) for i in range(1, count)):
                return first
    raise OSError(f"no {count} consecutive free ports on {host}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_until(
    check: Callable[[], object],
    *,
    timeout_s: float,
    what: str,
    record: ProcessRecord | None = None,
    interval_s: float = 0.2,
) -> None:
    """Poll ``check`` until it is true; fail early (with the log tail) if the process died.
    A process that is not ready in time is stopped before this raises: nothing else holds its
    record, so it would be left running, unknown to ``stack down``."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if record is not None and not record.is_running():
            raise StackError(f"{what}: process exited during start-up; {log_tail(record)}")
        try:
            if check():
                return
        except Exception as exc:
            last_error = exc
        time.sleep(interval_s)
    reason = f" (last error: {last_error})" if last_error else ""
    tail = f"; {log_tail(record)}" if record else ""
    if record is not None:
        stop_process(record)
    raise StackError(f"{what}: not ready after {timeout_s:.0f} s{reason}{tail}")


def log_tail(record: ProcessRecord, lines: int = 5) -> str:
    try:
        text = Path(record.log_file).read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return f"no log at {record.log_file}"
    return f"last log lines of {record.log_file}: " + " | ".join(text)


class Component:
    """A pipeline component run as its own process group (as in production), stdout and
    stderr appended to ``<folder>/<name>.json`` and ``<name>.log`` over every start."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], folder: Path) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.stdout_path = folder / f"{name}.json"
        self.log_path = folder / f"{name}.log"
        self.starts = 0
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        with open(self.stdout_path, "ab") as stdout, open(self.log_path, "ab") as stderr:
            return subprocess.Popen(self.command, env=self.env, stdout=stdout, stderr=stderr, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def restart(self) -> None:
        """Start the same command again (after it ended or was killed)."""
        if self.running():
            raise StackError(f"{self.name} is still running (pid {self.pid})")
        self.process = self._spawn()

    def signal_group(self, sig: signal.Signals, wait_s: float | None = None) -> int | None:
        """Send ``sig`` to the whole process group (a terminal's Ctrl-C does, a JVM child
        included); with ``wait_s`` wait that long for the exit and return its status."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        if wait_s is None:
            return None
        try:
            return self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """kill -9 of the process and every descendant, reaped. The whole tree: PySpark
        starts the job's JVM and Python workers in process groups of their own."""
        tree = self.tree()
        for member in tree:
            _signal(member, signal.SIGKILL)
        _wait_ended(tree[1:], 30.0)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            pass

    def stop(self, timeout_s: float = 90.0) -> dict[str, Any]:
        """SIGTERM (the components drain and print their summary), SIGKILL if it hangs; then
        end what it leaves behind: a process it started and did not stop (PySpark's JVM
        launcher, when the job is stopped while its session is still starting) would
        otherwise outlive it, orphaned in the component's session."""
        if self.running():
            tree = self.tree()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
            _end_all([*tree[1:], *_session_members(self.pid)])
        return self.result()

    def result(self) -> dict[str, Any]:
        """The newest JSON summary on stdout ({} when no start ended cleanly)."""
        text = self.stdout_path.read_text().strip() if self.stdout_path.exists() else ""
        start = text.rfind("\n{")
        try:
            return json.loads(text[start + 1 :] if start >= 0 else text) if text else {}
        except ValueError:
            return {"unparsed_output": text[-500:]}

    def tree(self) -> list[psutil.Process]:
        """The process and its descendants (the streaming job's JVM, the simulators' workers)."""
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
