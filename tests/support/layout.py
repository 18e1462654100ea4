"""Where the installed packages' source lives: pyproject.toml's setuptools configuration, read
once, so the repository checks name a module as it is imported (``streaming/job.py`` is
``iotwatch.streaming.job``), not by its folder."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.conftest import REPO_ROOT

SETUPTOOLS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
#: Every package the distribution installs.
PACKAGES: list[str] = SETUPTOOLS["packages"]
#: Installed package -> its folder, for the packages whose folder is not their dotted name.
PACKAGE_DIRS: dict[str, str] = SETUPTOOLS["package-dir"]
#: Top-level folder -> the package it installs as (``iotwatch`` itself, and each stage).
FOLDERS: dict[str, str] = {"iotwatch": "iotwatch", **{folder: name for name, folder in PACKAGE_DIRS.items()}}


def folder_of(package: str) -> Path:
    """The folder that holds ``package``'s ``__init__.py``."""
    for name in sorted(PACKAGE_DIRS, key=len, reverse=True):
        if package == name or package.startswith(name + "."):
            return REPO_ROOT / PACKAGE_DIRS[name] / Path(*package[len(name) :].split(".")[1:])
    return REPO_ROOT / Path(*package.split("."))


def installed_tree(dest: Path) -> Path:
    """``dest/iotwatch``: links laid out as the packages install (``iotwatch/streaming`` to
    ``streaming/``, ``iotwatch/settings.py`` to itself), for static tools such as mypy, which
    cannot follow setuptools' editable import hook. Returns ``dest``."""
    core = dest / "iotwatch"
    core.mkdir(parents=True)
    for entry in (REPO_ROOT / "iotwatch").iterdir():
        (core / entry.name).symlink_to(entry)
    for package in PACKAGE_DIRS:
        (dest / Path(*package.split("."))).symlink_to(folder_of(package), target_is_directory=True)
    return dest


def installed_path(path: str) -> str:
    """``path`` (relative to the repository) as laid out by :func:`installed_tree`."""
    folder, _, rest = path.partition("/")
    return "/".join([*FOLDERS[folder].split("."), rest]) if rest else "/".join(FOLDERS[folder].split("."))


def module_name(path: Path) -> str:
    """The name ``path`` (a ``.py`` file under a top-level folder of ``FOLDERS``) is imported by."""
    folder, *rest = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join([FOLDERS[folder], *rest]).removesuffix(".__init__")
