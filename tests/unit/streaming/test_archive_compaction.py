"""Compaction of the Parquet archive (files on disk, no servers): rows unchanged, the
archive's file naming kept, young files left alone, leftovers of a crash or a re-run removed."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from iotwatch.application.cli import cli
from iotwatch.errors import IotwatchError
from iotwatch.streaming.archive_compaction import compact
from iotwatch.streaming.sinks.archive import ARCHIVE_SCHEMA, file_name

FOLDER = "date=2026-11-27/device_type=thermostat"
HOUR_AGO = time.time() - 3600


def write_file(
    archive: Path, partition: int, first: int, last: int, *, folder: str = FOLDER, mtime: float = HOUR_AGO
) -> None:
    """A micro-batch's file as the job writes it: a reading per offset, seq = offset."""
    rows = [
        {"device_id": f"t{offset % 3}", "site": "h", "seq": offset, "event_ms": 1000 * offset, "detector": "d"}
        for offset in range(first, last + 1)
    ]
    path = archive / "readings" / folder / file_name(partition, first, last)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=ARCHIVE_SCHEMA), path)
    os.utime(path, (mtime, mtime))


def names(archive: Path, folder: str = FOLDER) -> list[str]:
    return sorted(path.name for path in (archive / "readings" / folder).iterdir())


def rows(archive: Path) -> list[tuple[str, int]]:
    tables = [pq.read_table(path) for path in sorted((archive / "readings").rglob("*.parquet"))]
    return sorted((d, s) for t in tables for d, s in zip(t["device_id"].to_pylist(), t["seq"].to_pylist(), strict=True))


def test_small_files_are_merged_per_partition_and_named_for_their_offsets(tmp_path: Path) -> None:
    for first in range(0, 100, 10):
        write_file(tmp_path, 0, first, first + 9)
        write_file(tmp_path, 1, 1000 + first, 1009 + first)
    write_file(tmp_path, 0, 100, 104, mtime=time.time())  # written a moment ago: the job's
    write_file(tmp_path, 2, 7, 7, folder="date=2026-11-27/device_type=door_sensor")  # alone: nothing to merge
    before = rows(tmp_path)

    result = compact(tmp_path, min_age_s=600).to_dict()

    assert names(tmp_path) == [
        file_name(0, 0, 99),
        file_name(0, 100, 104),
        file_name(1, 1000, 1099),
    ]
    assert rows(tmp_path) == before
    assert (result["folders"], result["files_before"], result["files_after"]) == (2, 22, 4)
    assert (result["files_merged"], result["files_written"], result["rows_merged"]) == (20, 2, 200)
    assert not list(tmp_path.rglob("*.tmp"))  # no temporary file left
    merged = pq.read_table(tmp_path / "readings" / FOLDER / names(tmp_path)[0])
    assert merged.schema == ARCHIVE_SCHEMA and merged["seq"].to_pylist() == list(range(100))  # offset order

    again = compact(tmp_path, min_age_s=600).to_dict()
    assert (again["files_merged"], again["superseded_removed"], again["files_after"]) == (0, 0, 4)


def test_outputs_stop_at_the_target_size(tmp_path: Path) -> None:
    """Inputs are packed up to the target; an output is merged again only while it is
    smaller than the target, so files settle at the target size."""
    for first in range(0, 400, 10):
        write_file(tmp_path, 0, first, first + 9)
    sizes = [path.stat().st_size for path in (tmp_path / "readings" / FOLDER).iterdir()]
    before = rows(tmp_path)

    result = compact(tmp_path, min_age_s=600, target_bytes=10 * max(sizes)).to_dict()

    assert (result["files_written"], result["files_after"]) == (4, 4)
    assert rows(tmp_path) == before
    outputs = sorted((tmp_path / "readings" / FOLDER).iterdir())
    largest = max(path.stat().st_size for path in outputs)
    assert compact(tmp_path, min_age_s=600, target_bytes=largest).files_merged == 0
    for path in outputs:  # outputs count as old once they are
        os.utime(path, (HOUR_AGO, HOUR_AGO))
    assert compact(tmp_path, min_age_s=600, target_bytes=4 * largest).files_written == 1
    assert rows(tmp_path) == before


def test_files_an_output_covers_are_removed_first(tmp_path: Path) -> None:
    """After a crash between an output's rename and its inputs' removal, or a micro-batch
    re-run after its file was merged, a file lies inside an output's offsets: it holds no
    new row, and goes, however young."""
    for first in range(0, 50, 10):
        write_file(tmp_path, 0, first, first + 9)
    compact(tmp_path, min_age_s=600)
    write_file(tmp_path, 0, 20, 29, mtime=time.time())  # the micro-batch 20..29 run again
    write_file(tmp_path, 0, 0, 9)  # an input the crash left behind
    assert len(rows(tmp_path)) == 70

    result = compact(tmp_path, min_age_s=600).to_dict()

    assert result["superseded_removed"] == 2
    assert names(tmp_path) == [file_name(0, 0, 49)]
    assert rows(tmp_path) == sorted((f"t{s % 3}", s) for s in range(50))


def test_a_damaged_file_leaves_its_group_alone_and_one_compaction_runs_at_a_time(tmp_path: Path) -> None:
    for first in range(0, 30, 10):
        write_file(tmp_path, 0, first, first + 9)
        write_file(tmp_path, 1, first, first + 9)
    damaged = tmp_path / "readings" / FOLDER / file_name(1, 30, 39)
    damaged.write_bytes(b"PAR1 cut short")
    os.utime(damaged, (HOUR_AGO, HOUR_AGO))

    result = compact(tmp_path, min_age_s=600).to_dict()

    assert (result["files_written"], result["files_after"]) == (1, 5)  # partition 0 merged
    assert len(result["failed_groups"]) == 1 and "part-00001" not in names(tmp_path)[0]
    assert damaged.exists() and not list(tmp_path.rglob("*.tmp"))
    with open(tmp_path / ".compaction.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(IotwatchError, match="another compaction"):
            compact(tmp_path)


def test_the_command_reports_what_it_did(tmp_path: Path) -> None:
    for first in range(0, 30, 10):
        write_file(tmp_path, 3, first, first + 9)
    result = CliRunner().invoke(cli, ["archive", "compact", "--archive", str(tmp_path), "--min-age", "60", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["archive"], report["files_before"], report["files_after"]) == (str(tmp_path), 3, 1)
    refused = CliRunner().invoke(cli, ["archive", "compact", "--archive", str(tmp_path), "--min-age", "5"])
    assert refused.exit_code == 2 and "--min-age" in refused.output


def _until(done: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.1)


def test_every_repeats_until_stopped_and_survives_a_failed_round(tmp_path: Path) -> None:
    for first in range(0, 30, 10):
        write_file(tmp_path, 0, first, first + 9)
    command = [sys.executable, "-m", "iotwatch.application", "archive", "compact", "--archive", str(tmp_path)]
    command += ["--min-age", "60", "--every", "60", "--json"]
    log = tmp_path / "stderr.log"

    with open(tmp_path / ".compaction.lock", "w") as lock, open(log, "wb") as stderr:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another compaction runs: the first round fails
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr)
        _until(lambda: "another compaction" in log.read_text(), "logged failure")
        assert process.poll() is None and len(names(tmp_path)) == 3
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0

    with open(log, "wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr)
        _until(lambda: len(names(tmp_path)) == 1, "compacted folder")
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=10)
    assert process.returncode == 0
    assert [json.loads(line)["files_after"] for line in out.splitlines()] == [1]
