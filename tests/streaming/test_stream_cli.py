"""``iotwatch stream`` as a user runs it: progress lines on stderr, a clean stop on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iotwatch.clients.kafka import ensure_topics
from iotwatch.settings import Settings
from tests.streaming.scenario import write_scenario

pytestmark = pytest.mark.slow

#: What a Java or Python stack trace, or py4j's report of one, looks like on stderr.
TRACE_MARKERS = ("\tat ", "Exception in thread", "Traceback", "Py4JJavaError", "java.lang.", "StackOverflowError")


def test_sigterm_stops_the_stream_cleanly_with_progress_lines_and_a_summary_table(
        test_settings: Settings, unique: str, tmp_path: Path) -> None:
    """Acceptance: a SIGTERM'd stream exits 0 with no Java trace on stderr; one progress line
    per micro-batch with records; the summary is a table (not a dict)."""
    ensure_topics(test_settings.kafka, test_settings.topics.kafka_topics())
    write_scenario(test_settings, unique)
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOTWATCH_")}
    env.update(IOTWATCH_TOPIC_RAW=test_settings.topics.raw, IOTWATCH_TOPIC_DLQ=test_settings.topics.dlq,
               IOTWATCH_TOPIC_ALERTS=test_settings.topics.alerts, IOTWATCH_STREAM_SILENCE_TIMEOUT_S="3600")
    checkpoint = tmp_path / "ck"
    argv = [sys.executable, "-m", "iotwatch", "stream", "--kafka", test_settings.kafka.bootstrap_servers,
            "--influx", "", "--checkpoint", str(checkpoint), "--archive", str(tmp_path / "ar"),
            "--max-offsets-per-trigger", "150"]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(list((checkpoint / "commits").glob("[0-9]*"))) < 2:
            assert process.poll() is None, process.communicate()
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)  # while batches are still coming (150 records each)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err[-3000:]
    assert not [line for line in err.splitlines() if any(m in line for m in TRACE_MARKERS)], err[-3000:]
    progress = [line for line in err.splitlines() if " stream: batch=" in line]
    assert len(progress) >= 2 and all("records=" in p and "rate=" in p and "lag=" in p and "batch_ms=" in p
                                      for p in progress), err
    assert not [line for line in err.splitlines() if "py4j" in line or line.startswith("[Stage")], err[-3000:]
    assert "iotwatch stream: stopped after" in out and "received" in out and "┃" in out, out
    assert "{" not in out, out
