"""Child processes of the embedded stack: a server that never becomes ready is not left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from iotwatch.errors import StackError
from iotwatch.stack.process import start_process, wait_until


def test_a_process_not_ready_in_time_is_stopped_before_the_error(tmp_path: Path) -> None:
    """Its record is known to nobody once the start fails (``stack down`` cannot find it), so
    the wait stops it: a Kafka node still recovering its logs after a crash was left running
    otherwise."""
    record = start_process("sleeper", ["sleep", "60"], tmp_path / "sleeper.log")
    assert record.is_running()
    with pytest.raises(StackError, match="sleeper: not ready after"):
        wait_until(lambda: False, timeout_s=0.5, what="sleeper", record=record)
    assert not record.is_running()
