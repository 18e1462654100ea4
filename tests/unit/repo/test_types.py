"""The type checker keeps the product typed: the files pyproject.toml's ``[tool.mypy]`` lists
(the core, ``iotwatch/``, and the streaming job, ``streaming/``) pass mypy in strict mode, and
silence it only line by line, naming the error code and saying why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.support.layout import installed_path, installed_tree
from tests.support.type_check import CONFIG, EXPLAINED, SILENCER, checked_files, silencers

ROOT = REPO_ROOT

#: What the checked list must keep covering (it may grow).
CORE = ["iotwatch/", "streaming/"]


def test_mypy_finds_no_error_in_the_checked_files(tmp_path: Path) -> None:
    """mypy reads the packages as they install (``iotwatch/streaming/job.py``): it cannot
    follow the editable install's import hook, so it runs over a tree of links to the source.
    It is given files, not folders: the tree's ``iotwatch/`` holds every stage."""
    tree = installed_tree(tmp_path)
    files = [installed_path(str(path.relative_to(ROOT))) for path in checked_files()]
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
        + ["--cache-dir", str(ROOT / ".mypy_cache"), *files],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"mypy found errors:\n{result.stdout}{result.stderr}"
    assert f"in {len(files)} source files" in result.stdout, result.stdout


def test_the_checked_files_cover_the_core_strictly() -> None:
    assert set(CORE) <= set(CONFIG["files"]), f"[tool.mypy] files must keep {sorted(set(CORE) - set(CONFIG['files']))}"
    assert CONFIG["strict"] is True
    loosening = ("ignore_errors", "disable_error_code")
    loosened = [o["module"] for o in CONFIG.get("overrides", []) if any(key in o for key in loosening)]
    assert not any(key in CONFIG for key in loosening) and not loosened, loosened
    # Overrides are for third-party libraries (stubs missing, re-exports): none for the product.
    modules = [
        m for o in CONFIG.get("overrides", []) for m in ([o["module"]] if isinstance(o["module"], str) else o["module"])
    ]
    assert not [m for m in modules if m.split(".")[0] == "iotwatch"], modules


def test_a_checked_file_silences_the_type_checker_only_with_a_code_and_a_reason() -> None:
    _, unexplained = silencers()
    assert not unexplained, "fix the type, or silence one line as `# type: ignore[error-code]  # why`:\n" + "\n".join(
        unexplained
    )


def test_the_silencer_rule_tells_an_explained_ignore_from_the_others() -> None:
    explained = [
        "x = f()  # type: ignore[arg-type]  # pandas-stubs ask an Index",
        "def f(  # type: ignore[misc, override]  # why",
    ]
    unexplained = [
        "x = f()  # type: ignore",
        "x = f()  # type: ignore[arg-type]",
        "x = f()  # type: ignore  # no code",
        "x = f()  # type: ignore[]  # empty",
        "x = f()  # pyright: ignore[reportArgumentType]  # not mypy's",
        "# mypy: disable-error-code=arg-type",
    ]
    assert all(SILENCER.search(line) and EXPLAINED.search(line) for line in explained)
    assert all(SILENCER.search(line) and not EXPLAINED.search(line) for line in unexplained)
