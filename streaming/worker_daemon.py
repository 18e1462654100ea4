"""PySpark's Python worker daemon with the job's modules loaded: the workers it forks start warm.

PySpark's daemon forks a Python worker for each task slot, and each worker then imports
pandas, pyarrow, numba and the job and loads the compiled kernels: about 1.2 s of CPU a
worker, spent on the way to the job's first alerts, and a private copy of every module's
memory in each. This daemon loads them once, before it forks (the job names it in
``spark.python.daemon.module``): its workers start warm and share those pages.

PySpark's own daemon imports nothing heavy before it forks, because a process that forks
while another of its threads holds a lock leaves that lock held for good in the child. So
this one forks from a single thread only. The job's settings turn off the one thread these
imports would start (pyarrow's jemalloc background thread: ``JE_ARROW_MALLOC_CONF``), and
Spark starts its Python processes with ``OMP_NUM_THREADS`` set, so numpy's OpenBLAS starts
none. If the process has any other thread after loading, it replaces itself with PySpark's
plain daemon.
"""

from __future__ import annotations

import os
import sys

#: The jemalloc settings that keep pyarrow from starting a background thread at import.
JEMALLOC_CONF = {"JE_ARROW_MALLOC_CONF": "background_thread:false"}


def threads() -> int:
    """This process's threads (0 where /proc cannot tell)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def compile_job() -> None:
    """Import the job's modules and compile its kernels, or load them from numba's cache.

    Compiling takes about 30 s of CPU and numba keeps the result on disk, so ``iotwatch
    setup`` runs this once: otherwise the first job's workers would each compile during its
    first micro-batch."""
    from iotwatch.models.catalog import warm_all
    from iotwatch.streaming import packing, processor, sequencing  # noqa: F401 - imported for its import cost

    processor.import_handlers()
    warm_all()
    sequencing.warm()


def load_job() -> None:
    """Load the job (:func:`compile_job`), then freeze the heap so that garbage collections
    in the workers do not copy the shared pages."""
    from iotwatch.heap import freeze_startup_heap

    compile_job()
    freeze_startup_heap()


def main() -> None:
    load_job()
    if threads() != 1:
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
