"""``iotwatch setup`` leaves nothing for the first job to fetch or compile."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import user_env

#: Run in a new process: import the job as a worker does and count numba's cache lookups
#: over every compiled function of the job's modules.
_CACHE_LOOKUPS = """
import json, sys
from numba.core.registry import CPUDispatcher
from iotwatch.streaming.worker_daemon import compile_job
compile_job()
hits = misses = 0
for name, module in list(sys.modules.items()):
    if not name.startswith("iotwatch."):
        continue
    for value in vars(module).values():
        if isinstance(value, CPUDispatcher):
            hits += sum(value.stats.cache_hits.values())
            misses += sum(value.stats.cache_misses.values())
print(json.dumps({"hits": hits, "misses": misses}))
"""


def test_after_setup_a_new_process_loads_every_kernel_from_numbas_cache() -> None:
    """Setup compiles the job's kernels into numba's cache on disk, so the Python workers of
    the first job load them instead of compiling for about 30 s in its first micro-batch."""
    setup = subprocess.run(
        [sys.executable, "-m", "iotwatch.application", "setup", "--json"],
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert setup.returncode == 0, setup.stderr
    assert json.loads(setup.stdout)["kernels"]["seconds"] > 0

    worker = subprocess.run(
        [sys.executable, "-c", _CACHE_LOOKUPS], env=user_env(), capture_output=True, text=True, timeout=300, check=False
    )
    assert worker.returncode == 0, worker.stderr
    lookups = json.loads(worker.stdout.strip().splitlines()[-1])
    assert lookups["misses"] == 0, lookups
    assert lookups["hits"] > 0, lookups
