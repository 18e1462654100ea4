"""Keep Spark's reused Python workers from re-scanning their whole heap after every task.

PySpark's daemon runs ``gc.collect()`` in a reused worker after each task it serves. A
worker of this job holds some 200,000 long-lived objects (pandas, pyarrow, numba, the
models' libraries), and a full collection over them took about 90 ms here -- with a few
tasks per micro-batch (Kafka reads, stateful calls), more CPU than the job's own work per
batch. :func:`freeze_imports` moves what exists once the job's modules are loaded into
the permanent generation (``gc.freeze``, made for forked servers like this one), so the
collections after each task scan only the objects that task made.
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_imports() -> None:
    """Once per process: collect what is garbage now, then freeze the rest (idempotent)."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True
