"""``iotwatch stream`` as a user runs it: progress lines on stderr, a clean stop on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iotwatch.clients.kafka import ensure_topics
from iotwatch.settings import Settings
from tests.helpers import user_env
from tests.support.scenario import write_scenario

pytestmark = pytest.mark.slow

#: What a Java or Python stack trace, or py4j's report of one, looks like on stderr.
TRACE_MARKERS = ("\tat ", "Exception in thread", "Traceback", "Py4JJavaError", "java.lang.", "StackOverflowError")


def in_progress(checkpoint: Path, after: int) -> bool:
    """A micro-batch is planned (its offsets written) and not committed, after ``after`` committed ones."""

    def ids(folder: str) -> set[int]:
        return {int(p.name) for p in (checkpoint / folder).glob("[0-9]*") if p.name.isdigit()}

    committed = ids("commits")
    return len(committed) >= after and bool(ids("offsets") - committed)


@pytest.mark.parametrize("committed", [0, 2], ids=["during-the-first-batch", "after-two-batches"])
def test_sigterm_stops_the_stream_cleanly_with_progress_lines_and_a_summary_table(
    test_settings: Settings, unique: str, tmp_path: Path, committed: int
) -> None:
    """Acceptance: a SIGTERM'd stream exits 0 with no Java trace on stderr, and nothing that
    Spark says about the interrupted work after "stopping" (while the first, slow micro-batch
    runs, or a later one); a progress line for the first micro-batch with records (then one
    every few seconds); the summary is a table (not a dict)."""
    ensure_topics(test_settings.kafka, test_settings.topics.kafka_topics())
    write_scenario(test_settings, unique)
    env = user_env()
    env.update(
        IOTWATCH_TOPIC_RAW=test_settings.topics.raw,
        IOTWATCH_TOPIC_DLQ=test_settings.topics.dlq,
        IOTWATCH_TOPIC_ALERTS=test_settings.topics.alerts,
        IOTWATCH_STREAM_SILENCE_TIMEOUT_S="3600",
    )
    checkpoint = tmp_path / "ck"
    argv = [
        sys.executable,
        "-m",
        "iotwatch.application",
        "stream",
        "--kafka",
        test_settings.kafka.bootstrap_servers,
        "--influx",
        "",
        "--checkpoint",
        str(checkpoint),
        "--archive",
        str(tmp_path / "ar"),
        "--max-offsets-per-trigger",
        "150",
    ]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not in_progress(checkpoint, after=committed):
            assert process.poll() is None, process.communicate()
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)  # while a micro-batch (150 records) is being processed
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    lines = err.splitlines()
    assert process.returncode == 0, err[-3000:]
    assert not [line for line in lines if any(m in line for m in TRACE_MARKERS)], err[-3000:]
    assert not [line for line in lines if " ERROR " in line], err[-3000:]
    stopping = next(i for i, line in enumerate(lines) if " iotwatch.streaming.job: stopping" in line)
    assert not [line for line in lines[stopping:] if " WARNING spark." in line], err[-3000:]
    assert not [line for line in lines if "py4j" in line or line.startswith("[Stage")], err[-3000:]
    progress = [line for line in lines if " stream: batch=" in line]
    assert all("records=" in p and "rate=" in p and "lag=" in p and "batch_ms=" in p for p in progress), err
    if committed:  # (stopped during the first batch, a run may end before its first progress line)
        assert progress, err
    assert "iotwatch stream: stopped after" in out and "{" not in out, out
    if committed:
        assert "received" in out and "┃" in out, out
        # a per-batch size is the last batch's, never summed over batches as if it were a count
        assert "state devices" not in out and "last batch: devices in state shards written" in out, out
