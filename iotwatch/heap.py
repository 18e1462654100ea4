"""Keep a long-running process's garbage collections small: freeze the heap it starts with.

CPython's full collection scans every tracked object. A component of this product holds
some 100,000-200,000 long-lived objects once its libraries are imported (Kafka and MQTT
clients, pydantic, pandas, pyarrow, numba), and one full collection over them takes tens
of milliseconds -- in the gateway a pause of the MQTT network thread that shows as its
latency tail, in a reused Spark Python worker (whose daemon collects after every task) more
CPU than the job's own work per micro-batch. :func:`freeze_startup_heap` moves what exists
after start-up into the permanent generation (``gc.freeze``, made for this), so later
collections scan only the objects made since.
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_startup_heap() -> None:
    """Once per process, after its modules are imported: collect what is garbage now, then
    freeze the rest (idempotent)."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True
