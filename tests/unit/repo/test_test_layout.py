"""The suite mirrors the code: every test file sits at its level, unit tests under the package
they test, and every test path a document or docstring names exists.

- ``tests/unit/<package>/``: pure logic, no servers (``tests/unit/conftest.py`` fails a unit
  test that asks for the embedded stack or Spark). ``<package>`` is a top-level package, a
  package of the core or the application (``jvm``, ``chaos``, ``stack``, ...), ``deploy`` (the deployment's
  files) or ``repo`` (checks over the whole repository: layering, documents, types).
- ``tests/integration/<package>/``: one component against real servers.
- ``tests/e2e/``: several processes, or the whole pipeline.
- ``tests/support/``: helpers and fixtures shared across levels (no tests).
"""

from __future__ import annotations

import re
import subprocess

from tests.conftest import REPO_ROOT

TESTS = REPO_ROOT / "tests"
LEVELS = ("unit", "integration", "e2e")
#: Unit folders that are no code package: the deployment's files, and the repository as a whole.
NOT_PACKAGES = {"deploy", "repo"}
#: A path under tests/ named in prose, e.g. tests/unit/models/test_detector_kernels.py or tests/e2e/.
_TEXT = {".py", ".md", ".toml", ".yml", ".yaml", ".properties", ".conf", ""}
_NAMED = re.compile(r"\btests/[\w/]+(?:\.py|/)")


def _package_exists(name: str) -> bool:
    """A top-level package, or a package of the core or of the application (``jvm``, ``stack``)."""
    return any((REPO_ROOT / folder / name / "__init__.py").exists() for folder in ("", "iotwatch", "application"))


def test_every_test_file_sits_at_a_level_and_unit_tests_under_their_package() -> None:
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 80  # (the walk found the suite)
    misplaced = []
    for path in files:
        parts = path.relative_to(TESTS).parts
        if parts[0] not in LEVELS:
            misplaced.append(f"{path.relative_to(REPO_ROOT)}: not under tests/unit, tests/integration or tests/e2e")
        elif parts[0] != "e2e" and (len(parts) != 3 or not (_package_exists(parts[1]) or parts[1] in NOT_PACKAGES)):
            misplaced.append(f"{path.relative_to(REPO_ROOT)}: not under tests/{parts[0]}/<package>/")
    assert not misplaced, "\n".join(misplaced)
    assert not list((TESTS / "support").glob("test_*.py")), "tests/support holds helpers, not tests"


def test_every_folder_of_the_suite_is_a_package() -> None:
    """Module names come from the folders (``tests.unit.models.test_kernels``), so two test
    files of the same name at different levels do not collide."""
    folders = {p.parent for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts}
    assert [str(f.relative_to(REPO_ROOT)) for f in sorted(folders) if not (f / "__init__.py").exists()] == []


def test_every_test_path_named_in_the_repository_exists() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    missing, named = [], 0
    for name in tracked.stdout.splitlines():
        path = REPO_ROOT / name
        if path.suffix not in _TEXT or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for found in _NAMED.findall(line):
                named += 1
                if not (REPO_ROOT / found).exists():
                    missing.append(f"{name}:{number}: {found}")
    assert named > 30  # (the pattern finds the paths the documents name)
    assert not missing, "test paths named but not in the repository:\n" + "\n".join(missing)
