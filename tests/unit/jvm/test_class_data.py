"""Which class-data archive the Spark driver maps, and when a JVM's dump becomes it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from iotwatch.jvm import class_data

JAVA = sys.executable  # any existing file stands for the runtime: its path, size and time count


def _dump(folder: Path, key: str, name: str, age_s: float, size: int = 10) -> Path:
    path = folder / f"{key}.{name}.jsa"
    path.write_bytes(b"x" * size)
    then = path.stat().st_mtime - age_s
    os.utime(path, (then, then))
    return path


def test_a_settled_dump_becomes_the_archive_and_older_ones_go(tmp_path: Path) -> None:
    key = "k1"
    assert class_data.adopt(tmp_path, key) is None
    _dump(tmp_path, key, "young", age_s=5)
    assert class_data.adopt(tmp_path, key) is None  # its JVM may still be writing it
    _dump(tmp_path, key, "old", age_s=300)
    newest = _dump(tmp_path, key, "newer", age_s=120)
    archive = class_data.adopt(tmp_path, key)
    assert archive == tmp_path / "k1.jsa" and archive.exists() and not newest.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k1.jsa", "k1.young.jsa"]
    _dump(tmp_path, key, "late", age_s=120)  # a JVM started before the archive was there
    assert class_data.adopt(tmp_path, key) == archive
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k1.jsa", "k1.young.jsa"]
    _dump(tmp_path, "k2", "empty", age_s=300, size=0)  # a JVM killed before it wrote anything
    assert class_data.adopt(tmp_path, "k2") is None


def test_the_key_follows_the_classpath_and_flags_not_system_properties() -> None:
    base = class_data.archive_key(JAVA, ["4.2.0", "/a.jar", "-Xms1g -Dlevel=WARN"])
    assert class_data.archive_key(JAVA, ["4.2.0", "/a.jar", "-Xms1g -Dlevel=DEBUG"]) == base
    assert class_data.archive_key(JAVA, ["4.2.0", "/b.jar", "-Xms1g -Dlevel=WARN"]) != base
    assert class_data.archive_key(JAVA, ["4.2.0", "/a.jar", "-Xms2g -Dlevel=WARN"]) != base
    assert class_data.archive_key(JAVA, ["4.1.0", "/a.jar", "-Xms1g -Dlevel=WARN"]) != base


def test_options_write_an_archive_first_then_map_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOTWATCH_CLASS_DATA_DIR", str(tmp_path / "cds"))
    assert class_data.jvm_options(JAVA, ["4.2.0"], writes=False) == ""  # a plain session does not write one
    first = class_data.jvm_options(JAVA, ["4.2.0"])
    assert first.startswith(f"-XX:ArchiveClassesAtExit={tmp_path / 'cds'}/") and "-Xlog:cds=off" in first
    # the JVM that writes the archive is given the time that takes when it is stopped; others are not
    assert class_data.exit_wait_s(["java", *first.split()], 10.0) == class_data.EXIT_WAIT_S
    assert class_data.exit_wait_s(["java", "-Xmx1g"], 10.0) == 10.0
    written = Path(first.split()[0].split("=", 1)[1])
    written.write_bytes(b"x" * 10)
    os.utime(written, (0, 0))
    key = written.name.split(".")[0]
    for writes in (True, False):
        mapped = class_data.jvm_options(JAVA, ["4.2.0"], writes=writes)
        assert mapped.startswith(f"-XX:SharedArchiveFile={tmp_path / 'cds' / key}.jsa ")
    monkeypatch.setenv("IOTWATCH_CLASS_DATA_DIR", "")
    assert class_data.jvm_options(JAVA, ["4.2.0"]) == ""


def test_archives_of_other_keys_left_unwritten_for_weeks_are_removed(tmp_path: Path) -> None:
    kept = [_dump(tmp_path, "k1", "mine", age_s=10**7), _dump(tmp_path, "k2", "recent", age_s=3600)]
    gone = _dump(tmp_path, "k3", "old", age_s=class_data.KEEP_S + 60)
    (tmp_path / "k4.jsa").write_bytes(b"x")
    os.utime(tmp_path / "k4.jsa", (0, 0))
    class_data.prune(tmp_path, "k1")
    assert all(p.exists() for p in kept) and not gone.exists() and not (tmp_path / "k4.jsa").exists()
