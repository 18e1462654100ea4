"""The pinned Spark release's fixes, built by ``iotwatch setup``, are what the job's JVM runs:
SPARK-58932's state-server socket is closed after each stateful task, so the JVM does not
collect sockets in CLOSE_WAIT micro-batch after micro-batch; the stateful operator's node
builds its driver-side handle only when used; the state server's interpreted projections and
the shared resolved encoders serve the micro-batches run here too; an Arrow batch for a Python
worker is sized every 64th row."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from iotwatch.clients.kafka import ensure_topics
from iotwatch.jvm.spark_patches import (
    CLOSE_STATE_SERVER_SOCKET,
    INTERPRETED_STATE_SERVER,
    LAZY_DRIVER_HANDLE,
    RESOLVED_ENCODERS,
    SIZE_EVERY_64_ROWS,
    SourcePatch,
    patch_jar,
    patches_needed,
)
from iotwatch.settings import Settings
from iotwatch.streaming.job import start
from tests.helpers import spark_jvms
from tests.support.scenario import write_scenario

pytestmark = pytest.mark.slow

STATE_SERVER = "org.apache.spark.sql.execution.python.streaming.TransformWithStateInPySparkStateServer"
OPERATOR_NODE = "org.apache.spark.sql.execution.python.streaming.TransformWithStateInPySparkExec"
STATE_ENCODER = "org.apache.spark.sql.execution.streaming.operators.stateful.transformwithstate.StateTypesEncoder"


def _close_wait(jvm: psutil.Process) -> int:
    return sum(c.status == psutil.CONN_CLOSE_WAIT for c in jvm.net_connections(kind="tcp"))


def _spark_jvm() -> psutil.Process:
    """This process's Spark JVM (each test worker starts its own)."""
    jvms = spark_jvms(os.getpid())
    assert jvms, "no Spark JVM among this process's children"
    return jvms[0]


@pytest.mark.parametrize(
    ("patch", "name"),
    [
        (CLOSE_STATE_SERVER_SOCKET, STATE_SERVER),
        (LAZY_DRIVER_HANDLE, OPERATOR_NODE),
        (INTERPRETED_STATE_SERVER, STATE_SERVER),
        (RESOLVED_ENCODERS, STATE_ENCODER),
        (SIZE_EVERY_64_ROWS, "org.apache.spark.sql.execution.python.BatchedPythonArrowInput$"),
    ],
)
def test_the_patched_classes_come_from_the_fix_jar(spark, patch: SourcePatch, name: str) -> None:  # type: ignore[no-untyped-def]
    assert patch in patches_needed()
    jar = patch_jar()
    assert jar is not None, "iotwatch setup did not build the Spark fixes"
    jvm = spark.sparkContext._jvm
    source = jvm.java.lang.Class.forName(name).getProtectionDomain().getCodeSource().getLocation()
    assert Path(source.getPath()) == jar


def test_micro_batches_leave_no_socket_in_close_wait(
    spark,  # type: ignore[no-untyped-def]
    test_settings: Settings,
    unique: str,
    tmp_path: Path,
) -> None:
    stream = test_settings.stream.model_copy(update={"silence_timeout_s": 3600.0, "max_offsets_per_trigger": 60})
    settings = test_settings.model_copy(update={"stream": stream})
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    write_scenario(settings, unique, per_device=120)
    jvm = _spark_jvm()
    before = _close_wait(jvm)
    job = start(
        spark,
        settings,
        checkpoint_dir=tmp_path / "ck",
        archive_dir=tmp_path / "ar",
        available_now=True,
        query_name=unique,
    )
    job.await_backlog(600)
    batches = job.totals["batches"]
    # without the fix: one socket per stateful task (shuffle partitions per batch) stays in CLOSE_WAIT
    assert batches >= 10, job.totals
    assert _close_wait(jvm) - before < 3, f"{_close_wait(jvm) - before} sockets in CLOSE_WAIT after {batches} batches"


def test_arrow_batches_to_a_python_worker_keep_their_byte_limit_within_64_rows(spark) -> None:  # type: ignore[no-untyped-def]
    """With the size summed every 64th row, a batch still ends at ``maxBytesPerBatch``: rows of
    about 1 kB under a 16 kB limit come in batches of 64 rows (the first check past 16 kB), not
    of ``maxRecordsPerBatch``."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    def sizes(batches):  # type: ignore[no-untyped-def]
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"rows": [batch.num_rows]})

    frame = spark.range(0, 1000, 1, 1).select(F.expr("repeat('x', 1000)").alias("payload"))
    spark.conf.set("spark.sql.execution.arrow.maxBytesPerBatch", "16k")
    try:
        rows = [r.rows for r in frame.mapInArrow(sizes, "rows long").collect()]
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxBytesPerBatch")
    assert sum(rows) == 1000 and max(rows) == 64 and len(rows) == 16
