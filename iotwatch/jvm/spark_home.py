"""The Spark home a local session's JVM runs from: pip's pyspark without its zipped copy of itself
(docs/internals.md, "Spark home")."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

#: What the linked home leaves out: the zipped Python sources.
LEFT_OUT = "python"


def local_spark_home(installed: Path, where: Path, version: str) -> Path:
    """A home of links to the entries of the Spark home ``installed`` (pip's pyspark) but
    :data:`LEFT_OUT`, made once in ``where`` and kept; several processes may make it at once."""
    digest = hashlib.sha256(str(installed.resolve()).encode()).hexdigest()[:12]
    home = where / f"spark-home-{version}-{digest}"
    if home.is_dir():
        return home
    staging = where / f".{home.name}.{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        for entry in installed.resolve().iterdir():
            if entry.name != LEFT_OUT:
                (staging / entry.name).symlink_to(entry)
        os.rename(staging, home)
    except OSError:
        if not home.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return home
