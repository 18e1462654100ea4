"""A user's clone has nothing beside it: no tracked file may reach outside the repository
for data (the CI runs the suite from an isolated clone too, see ``.ci/run``)."""

from __future__ import annotations

import subprocess

from tests.conftest import REPO_ROOT


def test_no_tracked_file_reads_beside_the_repository() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    offenders = []
    for name in tracked.stdout.splitlines():
        path = REPO_ROOT / name
        if path.suffix not in {".py", ".md", ".toml", ".sh", ".yml", ".yaml", ".cfg", ".ini", ""}:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        needle = "../" + "shared"  # split so this file does not match itself
        if needle in text or "shared/" + "datasets" in text:
            offenders.append(name)
    assert offenders == []


def test_shipped_nab_sample_is_complete() -> None:
    from iotwatch.evaluation.sources import NAB_SAMPLE, NabSource

    source = NabSource(NAB_SAMPLE)
    assert len(source.keys()) == 7 and set(source.windows) == set(source.keys())
    assert (NAB_SAMPLE / "LICENSE").read_text().startswith("The streams and labels")
