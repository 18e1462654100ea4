"""What the type check covers and how it may be silenced, read from pyproject.toml's
``[tool.mypy]``: shared by ``tests/unit/repo/test_types.py``, which enforces the rule, and the
run's summary (``tests/conftest.py``), which prints the count of ``type: ignore``."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.conftest import REPO_ROOT

CONFIG = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["mypy"]

#: ``# type: ignore``, ``# pyright: ignore`` and file-level ``# mypy: ...`` settings.
SILENCER = re.compile(r"#\s*(type:\s*ignore|pyright:\s*ignore|mypy:)")
#: The one allowed form: mypy's error codes in brackets, then a comment that says why.
EXPLAINED = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(,\s*[a-z-]+)*\]\s+#\s*\S")


def checked_files() -> list[Path]:
    """Every ``.py`` file the ``files`` entries name (a folder stands for all its files)."""
    files = []
    for entry in CONFIG["files"]:
        path = REPO_ROOT / entry
        assert path.exists(), f"pyproject.toml [tool.mypy] files lists {entry}, which does not exist"
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def silencers() -> tuple[list[str], list[str]]:
    """The checked files' silencing comments as ``path:line: text``: those in the allowed
    form (:data:`EXPLAINED`), and the others."""
    explained, unexplained = [], []
    for path in checked_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if SILENCER.search(line):
                where = f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
                (explained if EXPLAINED.search(line) else unexplained).append(where)
    return explained, unexplained
