"""Child processes of the embedded stack: a server that never becomes ready is not left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from iotwatch.application.stack.process import start_process, wait_until
from iotwatch.errors import StackError


def test_a_process_not_ready_in_time_is_stopped_before_the_error(tmp_path: Path) -> None:
    """Its record is known to nobody once the start fails (``stack down`` cannot find it), so
    the wait stops it: a Kafka node still recovering its logs after a crash was left running
    otherwise."""
    record = start_process("sleeper", ["sleep", "60"], tmp_path / "sleeper.log")
    assert record.is_running()
    with pytest.raises(StackError, match="sleeper: not ready after"):
        wait_until(lambda: False, timeout_s=0.5, what="sleeper", record=record)
    assert not record.is_running()


def test_a_stopped_component_leaves_nothing_of_its_own_running(tmp_path: Path) -> None:
    """A component that exits on SIGTERM without stopping a child it started (as the job did
    while PySpark's JVM launcher was still starting) does not leave that child orphaned."""
    import sys
    import time

    import psutil

    from iotwatch.application.stack.process import Component

    script = (
        "import signal, subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "print(child.pid, flush=True)\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "time.sleep(300)\n"
    )
    component = Component("leaky", [sys.executable, "-c", script], {}, tmp_path)
    deadline = time.monotonic() + 30
    while not component.stdout_path.read_text().strip():
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.1)
    child = psutil.Process(int(component.stdout_path.read_text().split()[0]))
    component.stop(timeout_s=10)
    assert not component.running()
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
