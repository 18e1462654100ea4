"""PySpark's Python worker daemon with the job's modules loaded: the workers it forks start
warm and share those pages; it forks from a single thread only
(docs/streaming-internals.md, "Worker daemon").
"""

from __future__ import annotations

import os
import sys

#: The workers' allocators: pyarrow's jemalloc without a background thread at import; glibc malloc
#: keeping up to 256 MB freed at the heap's top and serving blocks under 32 MB from the heap. With
#: glibc's defaults the heap shrank after each micro-batch and the next faulted its pages in again:
#: a fifth of the workers' CPU at 100,000 devices, in the kernel.
GLIBC_MALLOC = "glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=33554432"
WORKER_ALLOCATOR_ENV = {"JE_ARROW_MALLOC_CONF": "background_thread:false", "GLIBC_TUNABLES": GLIBC_MALLOC}


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
