"""Writing secret files: owner-only from the first byte, replaced atomically."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, data: str | bytes) -> None:
    """Write ``path`` with mode 0600 (created so, never world-readable in between) through a
    temporary file renamed into place, so a reader never sees half a password file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    payload = data.encode() if isinstance(data, str) else data
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing temporary file keeps its mode otherwise
    with os.fdopen(fd, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
