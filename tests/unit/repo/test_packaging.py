"""The distribution installs one top-level name, ``iotwatch``: the stages keep their folders
at the repository's top level (``streaming/``, ``models/``, ...) and install as
``iotwatch.streaming``, ``iotwatch.models``, ..., so an environment gains no module named
``models`` or ``alerts`` to clash with another project's.

pyproject.toml lists the packages and maps each stage to its folder (``package-dir``); the
checks read that configuration, the installed environment (a fresh interpreter outside the
repository, where the working directory puts nothing on the path) and the source's imports.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.support.layout import FOLDERS, PACKAGE_DIRS, PACKAGES, folder_of

#: The stages' folders, which are no top-level module of their own.
STAGE_FOLDERS = sorted(set(FOLDERS) - {"iotwatch"})


def _packages_on_disk() -> set[str]:
    """Every folder with an ``__init__.py`` under a source folder, by its installed name."""
    found = set()
    for folder, package in FOLDERS.items():
        for init in (REPO_ROOT / folder).rglob("__init__.py"):
            found.add(".".join([package, *init.parent.relative_to(REPO_ROOT / folder).parts]))
    return found


def test_every_package_installs_under_iotwatch() -> None:
    assert PACKAGES and all(p == "iotwatch" or p.startswith("iotwatch.") for p in PACKAGES), PACKAGES
    assert all(name.startswith("iotwatch.") for name in PACKAGE_DIRS), PACKAGE_DIRS
    assert {"streaming", "models", "devices", "gateway", "dashboards"} <= set(STAGE_FOLDERS)


def test_the_package_list_is_every_package_folder() -> None:
    on_disk = _packages_on_disk()
    assert "iotwatch.streaming.sinks" in on_disk and "iotwatch.models.kernels" in on_disk  # (the walk maps folders)
    assert set(PACKAGES) == on_disk, (
        f"pyproject.toml [tool.setuptools] packages: add {sorted(on_disk - set(PACKAGES))}, "
        f"remove {sorted(set(PACKAGES) - on_disk)}"
    )
    assert all((folder_of(p) / "__init__.py").is_file() for p in PACKAGES)


def test_every_top_level_package_folder_is_a_source_folder() -> None:
    folders = {path.parent.name for path in REPO_ROOT.glob("*/__init__.py")} - {"tests"}
    assert folders == set(FOLDERS), f"top-level folders not installed under iotwatch: {sorted(folders - set(FOLDERS))}"


def test_no_source_imports_a_stage_by_its_folder_name() -> None:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    wrong = []
    for name in tracked.stdout.split():
        for node in ast.walk(ast.parse((REPO_ROOT / name).read_text(), name)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module]
            else:
                continue
            wrong += [f"{name}:{node.lineno}: {t}" for t in targets if t.split(".")[0] in STAGE_FOLDERS]
    assert not wrong, "import the stages as iotwatch.<stage>:\n" + "\n".join(wrong)


def test_the_installed_environment_has_only_the_namespace(tmp_path: Path) -> None:
    """Outside the repository, ``iotwatch.streaming`` imports from ``streaming/`` and no stage
    imports by its bare name."""
    probe = (
        "import importlib.util, json, sys; import iotwatch.streaming.job, iotwatch.models.kernels; "
        "print(json.dumps({'job': iotwatch.streaming.job.__file__, 'kernels': iotwatch.models.kernels.__file__, "
        "'bare': [n for n in sys.argv[1:] if importlib.util.find_spec(n) is not None]}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, *STAGE_FOLDERS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert Path(found["job"]) == REPO_ROOT / "streaming" / "job.py"
    assert Path(found["kernels"]) == REPO_ROOT / "models" / "kernels" / "__init__.py"
    assert found["bare"] == [], f"importable by their folder names: {found['bare']}"


def test_the_installed_distribution_names_one_top_level_package() -> None:
    assert (distribution("iotwatch").read_text("top_level.txt") or "").split() == ["iotwatch"]
