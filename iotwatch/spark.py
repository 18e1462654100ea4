"""One way to get a Spark session, for the streaming job and the batch jobs alike.

Local mode is the embedded default; under ``spark-submit`` the master (and the cluster's
own settings) come from spark-submit and are left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from iotwatch.errors import StackError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def require_java() -> None:
    """Spark needs a JVM: say what to install instead of a py4j stack trace."""
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return
    raise StackError("Java 17+ is needed for Spark: apt-get install -y openjdk-17-jre-headless (or set JAVA_HOME)")


def under_spark_submit() -> bool:
    """True inside ``spark-submit`` (the JVM is already up and sets the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_session(app_name: str, master: str | None = "local[2]", *, shuffle_partitions: int = 4,
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """A session with UTC time, Arrow transfers and the given extra ``conf``; Python workers
    use this interpreter (its venv has the project's packages) unless told otherwise."""
    from pyspark.sql import SparkSession

    require_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.appName(app_name)
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions)))
    if master and not under_spark_submit():
        builder = builder.master(master).config("spark.ui.enabled", "false")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


@contextmanager
def session_scope(app_name: str, master: str | None = "local[2]", **kwargs: Any) -> Iterator[SparkSession]:
    """A session for one command: stopped at the end only if this call started it (a test
    suite or a notebook that already has one keeps it)."""
    from pyspark.sql import SparkSession

    existed = SparkSession.getActiveSession() is not None
    spark = spark_session(app_name, master, **kwargs)
    try:
        yield spark
    finally:
        if not existed:
            try:
                spark.stop()
            except Exception as exc:  # noqa: BLE001 - the JVM may already be shutting down
                log.warning("stopping Spark: %s", str(exc).splitlines()[0])
