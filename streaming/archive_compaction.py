"""Compaction of the Parquet archive: many small files merged into few, rows unchanged, safe
while the job runs (docs/streaming-internals.md, "Archive compaction").
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from iotwatch.errors import IotwatchError
from iotwatch.streaming.sinks.archive import ARCHIVE_SCHEMA, file_name

log = logging.getLogger(__name__)

#: ``part-<partition>-<first offset>-<last offset>.parquet``, as :func:`file_name` names files.
FILE_NAME = re.compile(r"^part-(\d+)-(\d+)-(\d+)\.parquet$")
#: Rows written to an output at a time: Parquet row groups of a useful size, memory bounded.
ROW_GROUP_ROWS = 128 * 1024


@dataclass(frozen=True)
class ArchiveFile:
    """One archive file: where it is, and the offsets of its Kafka partition it holds."""

    path: Path
    partition: int
    first: int
    last: int
    size: int
    mtime: float

    @classmethod
    def of(cls, path: Path) -> ArchiveFile | None:
        match = FILE_NAME.match(path.name)
        if match is None:
            return None
        stat = path.stat()
        partition, first, last = (int(group) for group in match.groups())
        return cls(path, partition, first, last, stat.st_size, stat.st_mtime)


@dataclass
class CompactionResult:
    """What one compaction did, for ``--json`` and the logs."""

    folders: int = 0
    files_before: int = 0
    files_merged: int = 0
    files_written: int = 0
    superseded_removed: int = 0
    bytes_merged: int = 0
    rows_merged: int = 0
    seconds: float = 0.0
    #: groups left unmerged because a file could not be read or written, with the reason
    failed_groups: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        files_after = self.files_before - self.files_merged - self.superseded_removed + self.files_written
        return {**asdict(self), "files_after": files_after, "seconds": round(self.seconds, 1)}


def compact(archive: Path, min_age_s: float = 3600.0, target_bytes: int = 128 * 2**20) -> CompactionResult:
    """Compact ``<archive>/readings`` (see the module's docstring). One compaction at a time
    per archive (a lock file): a second one, e.g. from an overlapping schedule, is refused."""
    root = archive / "readings"
    if not root.is_dir():
        return CompactionResult()
    with open(archive / ".compaction.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IotwatchError(f"another compaction of {archive} is running; try again when it ends") from None
        return _compact(root, min_age_s, target_bytes)


def _compact(root: Path, min_age_s: float, target_bytes: int) -> CompactionResult:
    started = time.monotonic()
    result = CompactionResult()
    folders = sorted({path.parent for path in root.glob("date=*/device_type=*/part-*.parquet")})
    cutoff = time.time() - min_age_s
    for folder in folders:
        result.folders += 1
        files = [found for path in folder.glob("part-*.parquet") if (found := ArchiveFile.of(path))]
        result.files_before += len(files)
        by_partition: dict[int, list[ArchiveFile]] = defaultdict(list)
        for found in files:
            by_partition[found.partition].append(found)
        for partition_files in by_partition.values():
            kept = _remove_superseded(partition_files, result)
            old = sorted((f for f in kept if f.mtime < cutoff), key=lambda f: (f.first, f.last))
            for group in _packed(old, target_bytes):
                try:
                    _merge(folder, group, result)
                except (OSError, pa.ArrowException) as exc:  # a damaged file stops its group only
                    log.warning("archive compaction left %d files of %s as they are: %s", len(group), folder, exc)
                    result.failed_groups.append(f"{folder}: {exc}")
    result.seconds = time.monotonic() - started
    return result


def _remove_superseded(files: list[ArchiveFile], result: CompactionResult) -> list[ArchiveFile]:
    """Remove the files whose offsets another file of the folder and partition covers;
    returns the others. (Of two files with the same range, the larger is kept.)"""
    kept: list[ArchiveFile] = []
    reach = -1  # the highest last offset of the files kept so far (each starts at or before)
    for candidate in sorted(files, key=lambda f: (f.first, -f.last, -f.size)):
        if candidate.last <= reach:
            candidate.path.unlink(missing_ok=True)
            result.superseded_removed += 1
        else:
            kept.append(candidate)
            reach = candidate.last
    return kept


def _packed(files: list[ArchiveFile], target_bytes: int) -> Iterator[list[ArchiveFile]]:
    """Consecutive runs of ``files`` whose sizes add up to at most ``target_bytes``; runs of
    one file are left alone (nothing to merge)."""
    group: list[ArchiveFile] = []
    size = 0
    for found in files:
        if group and size + found.size > target_bytes:
            if len(group) > 1:
                yield group
            group, size = [], 0
        group.append(found)
        size += found.size
    if len(group) > 1:
        yield group


def _merge(folder: Path, group: list[ArchiveFile], result: CompactionResult) -> None:
    """Write ``group``'s rows, in order, as one file named for its offsets; then remove ``group``."""
    partition = group[0].partition
    name = file_name(partition, min(f.first for f in group), max(f.last for f in group))
    temporary = folder / f".{name}.{uuid.uuid4().hex}.tmp"
    rows = 0
    try:
        with pq.ParquetWriter(temporary, ARCHIVE_SCHEMA, compression="snappy") as writer:
            pending: list[pa.Table] = []
            pending_rows = 0
            for found in group:
                table = pq.read_table(found.path, schema=ARCHIVE_SCHEMA)
                pending.append(table)
                pending_rows += table.num_rows
                if pending_rows >= ROW_GROUP_ROWS:
                    writer.write_table(pa.concat_tables(pending), row_group_size=ROW_GROUP_ROWS)
                    rows += pending_rows
                    pending, pending_rows = [], 0
            if pending:
                writer.write_table(pa.concat_tables(pending), row_group_size=ROW_GROUP_ROWS)
                rows += pending_rows
        os.replace(temporary, folder / name)
    finally:
        temporary.unlink(missing_ok=True)
    for found in group:
        if found.path.name != name:
            found.path.unlink(missing_ok=True)
    result.files_merged += len(group)
    result.files_written += 1
    result.bytes_merged += sum(f.size for f in group)
    result.rows_merged += rows
