"""Keep a long-running process's garbage collections small: freeze the heap it starts with
(docs/internals.md, "Frozen start-up heap")."""

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
