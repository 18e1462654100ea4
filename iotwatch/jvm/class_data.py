"""Class-data sharing for the local Spark driver (and the embedded Kafka broker): its start-up without
loading Spark anew (docs/internals.md, "Class-data sharing")."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

#: A dump younger than this may still be being written by a JVM that is exiting.
SETTLE_S = 60.0

#: Archives of other keys (an older Spark, a moved virtualenv) unchanged this long are removed.
KEEP_S = 14 * 86_400.0

#: Longest wait for a JVM that writes its archive as it exits (the first job of a classpath:
#: tens of seconds); killed while writing, it would leave an archive no JVM can map.
EXIT_WAIT_S = 120.0

#: The option of a JVM that writes its archive at exit (:func:`jvm_options`).
_WRITES_AT_EXIT = "-XX:ArchiveClassesAtExit="

#: Quiet the JVM's own notes about the archive (a mismatch falls back silently, as intended).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off -Xlog:class+path=off"


def folder() -> Path | None:
    """Where archives live: IOTWATCH_CLASS_DATA_DIR, else ``~/.iotwatch/class-data``; None
    when the variable is set empty (sharing off)."""
    configured = os.environ.get("IOTWATCH_CLASS_DATA_DIR")
    if configured == "":
        return None
    return Path(configured or Path.home() / ".iotwatch" / "class-data").expanduser()


def archive_key(java: str, parts: Iterable[str]) -> str:
    """A short digest of the Java runtime (its path, size and time) and ``parts`` (the Spark
    release, the classpath, the JVM options; system properties, ``-D...``, do not count):
    equal keys, interchangeable archives."""
    stat = Path(java).resolve().stat()
    digest = hashlib.sha256(f"{Path(java).resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    for part in parts:
        kept = " ".join(token for token in part.split() if not token.startswith("-D"))
        digest.update(b"|" + kept.encode())
    return digest.hexdigest()[:16]


def adopt(where: Path, key: str, now: float | None = None) -> Path | None:
    """The archive of ``key`` in ``where``: the adopted one, or the newest settled dump, which
    becomes it (older dumps of the key are removed); None when there is none yet."""
    archive = where / f"{key}.jsa"
    now = time.time() if now is None else now
    dumps = sorted(where.glob(f"{key}.*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    settled = [p for p in dumps if now - p.stat().st_mtime >= SETTLE_S and p.stat().st_size > 0]
    if settled and not archive.exists():
        os.replace(settled.pop(0), archive)
    for stale in settled:  # dumps of JVMs that started before the archive was there
        stale.unlink(missing_ok=True)
    return archive if archive.exists() else None


def prune(where: Path, key: str, now: float | None = None) -> None:
    """Remove the archives and dumps of other keys that nothing has written for
    :data:`KEEP_S` (a JVM that maps one keeps its pages: removing the file does not harm it)."""
    now = time.time() if now is None else now
    for path in where.glob("*.jsa"):
        if not path.name.startswith(key + ".") and now - path.stat().st_mtime > KEEP_S:
            path.unlink(missing_ok=True)


def jvm_options(java: str, parts: Iterable[str], writes: bool = True) -> str:
    """Options that make the driver JVM use the archive of its classpath, or (``writes``)
    write one at its exit when there is none yet; empty when sharing is off, there is nothing
    to map and nothing to write, or the folder cannot be made."""
    where = folder()
    if where is None:
        return ""
    try:
        where.mkdir(parents=True, exist_ok=True)
        key = archive_key(java, parts)
        archive = adopt(where, key)
        prune(where, key)
    except OSError:
        return ""
    if archive is not None:
        return f"-XX:SharedArchiveFile={archive} {QUIET}"
    if not writes:
        return ""
    return f"{_WRITES_AT_EXIT}{where / f'{key}.{uuid.uuid4().hex[:8]}.jsa'} {QUIET}"


def exit_wait_s(command: Sequence[str], timeout_s: float) -> float:
    """How long to wait for ``command``'s process to exit before killing it: ``timeout_s``, or
    :data:`EXIT_WAIT_S` when it is a JVM writing its archive at exit."""
    writes = any(part.startswith(_WRITES_AT_EXIT) for part in command)
    return max(timeout_s, EXIT_WAIT_S) if writes else timeout_s
