"""The Spark home a local session's JVM runs from: pip's pyspark without its zipped copy of itself.

pip's pyspark also carries its Python sources zipped in ``python/lib`` (for executors without
pyspark), and Spark puts those zips first on the path of every Python process it starts; Python
keeps no bytecode for a zipped module, so each such process compiles pyspark anew, about 0.6 s
of CPU on the way to the first alert (docs/concepts.md, "Start-up").

A local session's Python workers run this interpreter, which has pyspark installed. Its JVM
therefore runs from a home of links to the installation's entries, ``python`` left out, and
the workers import the installed package with its cached bytecode. The home lives beside the
jars ``iotwatch setup`` installs (:func:`iotwatch.jvm.jars.jars_root`), one per pyspark
installation, so that every session has the same classpath and maps the same class-data
archive. A Spark home the user chose (``SPARK_HOME``), or workers on another interpreter, are
used as they are.
"""

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
