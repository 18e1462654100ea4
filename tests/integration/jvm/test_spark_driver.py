"""The local-mode driver JVM as :mod:`iotwatch.jvm.spark` starts it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from iotwatch.jvm.spark import LOCAL_DRIVER_MEMORY, LOCAL_MALLOC_ARENAS, jvm_tmpdir
from tests.helpers import user_env


def test_the_driver_heap_is_committed_at_start(spark: Any) -> None:
    """The heap is committed at its maximum from the start (``-Xms`` = ``-Xmx``, pre-touched),
    so the driver's resident memory does not climb as the collector grows the heap."""
    runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
    assert LOCAL_DRIVER_MEMORY == "1g"
    assert runtime.maxMemory() >= 0.9 * 2**30
    assert runtime.totalMemory() >= 0.95 * runtime.maxMemory()
    management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    arguments = list(management.getRuntimeMXBean().getInputArguments())
    assert "-XX:+AlwaysPreTouch" in arguments


def test_the_driver_jvm_runs_with_few_malloc_arenas(spark: Any) -> None:
    """The JVM's environment caps glibc's malloc arenas, so native memory freed by its
    short-lived threads is used again instead of kept in an arena per thread."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', LOCAL_MALLOC_ARENAS)}".encode() in environ


def test_the_driver_unpacks_into_a_folder_of_this_process_and_a_dead_process_s_folder_goes(spark: Any) -> None:
    """What the JVM unpacks (RocksDB's native library, Spark's scratch folders) is in this
    process's own ``java.io.tmpdir``; the folder of a process no longer running, as a job
    killed with -9 leaves it, is removed when the next JVM is given its folder."""
    own = Path(spark.sparkContext._jvm.java.lang.System.getProperty("java.io.tmpdir"))
    assert own == Path(tempfile.gettempdir()) / f"iotwatch-java-{os.getpid()}" and own.is_dir()
    spark.sparkContext._jvm.org.rocksdb.RocksDB.loadLibrary()
    assert list(own.glob("librocksdbjni*")) and list(own.glob("spark-*"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = Path(tempfile.gettempdir()) / f"iotwatch-java-{int(dead.stdout)}"
    (left / "spark-x").mkdir(parents=True)
    assert jvm_tmpdir() == own and own.is_dir() and not left.exists()


def test_python_workers_import_pyspark_as_installed(spark: Any) -> None:
    """The Python workers import the installed pyspark, with its cached bytecode, not the
    zipped copy that Spark puts first on their path for machines without pyspark: nothing to
    compile when a worker starts (:mod:`iotwatch.jvm.spark_home`)."""
    import pyspark
    from pyspark.sql import functions as F

    where = F.udf(lambda _: json.dumps([__import__("pyspark").__file__, [p for p in sys.path if ".zip" in p]]))
    worker_pyspark, zips = json.loads(spark.range(1).select(where("id")).first()[0])
    assert worker_pyspark == pyspark.__file__
    assert not [path for path in zips if Path(path).exists()]


_ENVIRONMENT = """
import json, os, sys
before = dict(os.environ)
from pyspark.sql import functions as F
from iotwatch.jvm.spark import session_scope
with session_scope("environment") as spark:
    worker = F.udf(lambda _: json.dumps([sys.executable, os.environ.get("MALLOC_ARENA_MAX")]))
    seen = json.loads(spark.range(1).select(worker("id")).first()[0])
    same = dict(os.environ) == before
    print("ENVIRONMENT", json.dumps({"worker": seen, "unchanged": same, "driver": sys.executable}))
"""


def test_the_session_leaves_this_process_environment_alone(tmp_path: Path) -> None:
    """The local JVM gets its settings (malloc arenas, the workers' interpreter) in an
    environment of its own: starting a session leaves the Python process's environment
    untouched, and the Python workers run this interpreter with the arena cap."""
    env = {k: v for k, v in user_env(tmp_path).items() if k not in ("PYSPARK_PYTHON", "MALLOC_ARENA_MAX")}
    done = subprocess.run([sys.executable, "-c", _ENVIRONMENT], env=env, capture_output=True, text=True, timeout=300)
    line = next((line for line in done.stdout.splitlines() if line.startswith("ENVIRONMENT")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-2000:]
    seen = json.loads(line.split(" ", 1)[1])
    assert seen["unchanged"] is True
    assert seen["worker"] == [seen["driver"], LOCAL_MALLOC_ARENAS]


_SHARING = """
from iotwatch.settings import StreamSettings
from iotwatch.streaming.job import session_scope
with session_scope(StreamSettings(), "class-data") as spark:
    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    print("SHARING", bean.getVMOption("UseSharedSpaces").getValue(), bean.getVMOption("SharedArchiveFile").getValue())
"""


def _sharing(env: dict[str, str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _SHARING], env=env, capture_output=True, text=True, timeout=300)
    line = next((line for line in done.stdout.splitlines() if line.startswith("SHARING")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-2000:]
    return line.split()[1:]


def _written(folder: Path, timeout_s: float = 120) -> Path:
    """The one dump in ``folder`` once its size stops changing."""
    deadline, sizes = time.monotonic() + timeout_s, [-1]
    while time.monotonic() < deadline:
        dumps = list(folder.glob("*.*.jsa"))
        if len(dumps) == 1:
            sizes.append(dumps[0].stat().st_size)
            if sizes[-1] == sizes[-2] > 10_000_000:
                return dumps[0]
        time.sleep(1.0)
    raise AssertionError(f"no finished class-data dump in {folder} within {timeout_s} s: {sizes[-3:]}")


def test_a_later_driver_maps_the_class_data_archive_the_first_wrote(tmp_path: Path) -> None:
    """The first streaming job's JVM of a classpath writes its classes' archive at exit; a
    later one, once the archive is adopted, maps it (the JVM's own UseSharedSpaces says so)."""
    env = {**user_env(tmp_path), "IOTWATCH_CLASS_DATA_DIR": str(tmp_path / "cds")}
    assert _sharing(env)[0] == "true"  # the JDK's base archive; this one writes the dynamic one
    dump = _written(tmp_path / "cds")  # by the JVM as it exits, after its Python driver
    os.utime(dump, (0, 0))  # settled: as if written a while ago
    used, archive = _sharing(env)
    assert used == "true" and archive == str(tmp_path / "cds" / f"{dump.name.split('.')[0]}.jsa")
