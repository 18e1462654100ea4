"""The type checker keeps the checked core typed: the files pyproject.toml's ``[tool.mypy]``
lists (the contract, settings, errors, stats, the clients and the streaming engine) pass
mypy in strict mode, and none of them silences it with an inline comment."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.support.layout import installed_path, installed_tree

ROOT = REPO_ROOT
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]

#: What the checked list must keep covering (it may grow).
CORE = [
    "iotwatch/contract/",
    "iotwatch/settings.py",
    "iotwatch/errors.py",
    "iotwatch/stats.py",
    "iotwatch/clients/",
    "streaming/engine.py",
]

#: ``# type: ignore``, ``# pyright: ignore`` and file-level ``# mypy: ...`` settings.
SILENCER = re.compile(r"#\s*(type:\s*ignore|pyright:\s*ignore|mypy:)")


def _checked_files() -> list[Path]:
    files = []
    for entry in CONFIG["files"]:
        path = ROOT / entry
        assert path.exists(), f"pyproject.toml [tool.mypy] files lists {entry}, which does not exist"
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def test_mypy_finds_no_error_in_the_checked_core(tmp_path: Path) -> None:
    """mypy reads the packages as they install (``iotwatch/streaming/engine.py``): it cannot
    follow the editable install's import hook, so it runs over a tree of links to the source."""
    tree = installed_tree(tmp_path)
    files = [installed_path(entry) for entry in CONFIG["files"]]
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
        + ["--cache-dir", str(ROOT / ".mypy_cache"), *files],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"mypy found errors:\n{result.stdout}{result.stderr}"
    assert f"in {len(_checked_files())} source files" in result.stdout, result.stdout


def test_the_checked_files_cover_the_core_strictly() -> None:
    assert set(CORE) <= set(CONFIG["files"]), f"[tool.mypy] files must keep {sorted(set(CORE) - set(CONFIG['files']))}"
    assert CONFIG["strict"] is True
    loosening = ("ignore_errors", "disable_error_code")
    loosened = [o["module"] for o in CONFIG.get("overrides", []) if any(key in o for key in loosening)]
    assert not any(key in CONFIG for key in loosening) and not loosened, loosened


def test_no_checked_file_silences_the_type_checker() -> None:
    silenced = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _checked_files()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SILENCER.search(line)
    ]
    assert not silenced, "fix the type instead of silencing mypy:\n" + "\n".join(silenced)
