"""A real Spark standalone cluster on this machine: one master and one worker JVM.

Started with the ``spark-class`` launcher PySpark ships, the way ``sbin/start-master.sh``
and ``start-worker.sh`` start them on a cluster; applications reach it with
``spark-submit --master spark://…`` and their executors run in the worker's JVMs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyspark

from iotwatch.application.stack.process import free_port
from iotwatch.jvm.jars import spark_kafka_connector

SPARK_HOME = Path(pyspark.__file__).parent


@dataclass(frozen=True)
class StandaloneCluster:
    master_url: str
    worker_dir: Path  # each application's executors work in app-*/ below it

    def submit_command(self, script: Path, *args: str, python: str) -> list[str]:
        return [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--master",
            self.master_url,
            "--conf",
            f"spark.pyspark.python={python}",
            "--conf",
            f"spark.pyspark.driver.python={python}",
            "--conf",
            "spark.executor.memory=1g",
            "--conf",
            "spark.ui.enabled=false",
            # Spark's Kafka connector, as a cluster deployment passes it (or --packages)
            "--jars",
            ",".join(str(jar) for jar in spark_kafka_connector().jars()),
            str(script),
            *args,
        ]


def _wait_for(log: Path, text: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.5)
    raise RuntimeError(f"Spark standalone: {text!r} not in {log}:\n{log.read_text(errors='replace')[-2000:]}")


@contextmanager
def standalone_cluster(folder: Path, cores: int = 2, memory: str = "2g") -> Iterator[StandaloneCluster]:
    """Master and worker as their own process groups; both stopped at the end."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_WORKER_DIR": str(folder / "work"),
        "SPARK_LOG_DIR": str(folder),
    }
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        master_log = folder / "master.log"
        master = subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(free_port()),
            ],
            env=env,
            stdout=open(master_log, "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        processes.append(master)
        _wait_for(master_log, "I have been elected leader", master, 120)
        worker_log = folder / "worker.log"
        worker = subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                "--cores",
                str(cores),
                "--memory",
                memory,
                "--host",
                "127.0.0.1",
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(folder / "work"),
                master_url,
            ],
            env=env,
            stdout=open(worker_log, "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        processes.append(worker)
        _wait_for(worker_log, "Successfully registered with master", worker, 120)
        yield StandaloneCluster(master_url, folder / "work")
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(10)
