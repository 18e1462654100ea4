"""The documentation site builds with ``mkdocs build --strict``: a broken link, a missing page
or a page left out of the navigation fails the build, and so this test."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from iotwatch.application.cli import SUBCOMMANDS
from tests.conftest import REPO_ROOT
from tests.unit.repo.test_no_narration import NARRATION


def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(root / "mkdocs.yml"),
            "-d",
            str(site),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _nav_pages(nav: list) -> list[str]:
    pages = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_the_site_builds_strictly_with_every_page(tmp_path: Path) -> None:
    config = yaml.load((REPO_ROOT / "mkdocs.yml").read_text(), Loader=yaml.Loader)  # mkdocs.yml has python/name tags
    pages = _nav_pages(config["nav"])
    for page in ("concepts.md", "contract.md", "detection.md", "runbooks.md", "benchmarks.md"):
        assert page in pages
    assert {"reference/commands.md", "reference/settings.md"} <= set(pages)
    assert len([p for p in pages if p.startswith("operate/")]) == 9
    result = _build(REPO_ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    commands = (tmp_path / "site" / "reference" / "commands" / "index.html").read_text()
    for name in SUBCOMMANDS:
        assert f"iotwatch {name}" in commands, f"the command reference lacks `iotwatch {name}`"
    assert "--anomaly-rate" in commands and "(your user name)" in commands  # options as --help prints them
    assert "Sentinel" not in commands and "&lt;function" not in commands
    help_text = html.unescape(re.sub(r"<[^>]+>", "", commands))  # the commands' help, as rendered
    assert not [line for line in help_text.splitlines() if NARRATION.search(line)]


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(REPO_ROOT / "docs", tmp_path / "docs")
    shutil.copy(REPO_ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    for served in ("application/reference_pages/site_results.py", "benchmarks/results"):  # the site's hook, its files
        (tmp_path / served).parent.mkdir(parents=True, exist_ok=True)
        copy = shutil.copytree if (REPO_ROOT / served).is_dir() else shutil.copy
        copy(REPO_ROOT / served, tmp_path / served)
    with (tmp_path / "docs" / "index.md").open("a") as page:
        page.write("\n[a page that is not there](missing.md)\n")
    result = _build(tmp_path, tmp_path / "site")
    assert result.returncode != 0 and "missing.md" in result.stderr, result.stderr
    assert "benchmarks/results" not in result.stderr, result.stderr  # (only the planted link is broken)


def test_the_readme_links_point_at_files_that_exist() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    links = [link for link in re.findall(r"\]\(([^)#\s]+)", readme) if "://" not in link]
    assert len(links) > 10
    for link in links:
        assert (REPO_ROOT / link).exists(), f"README.md links to {link}, which does not exist"


def test_the_readme_and_the_concepts_page_show_the_same_architecture_diagram() -> None:
    def diagram(path: Path) -> str:
        found = re.search(r"^```mermaid\n.*?^```", path.read_text(), re.M | re.S)
        assert found is not None, path
        return found.group(0)

    assert diagram(REPO_ROOT / "README.md") == diagram(REPO_ROOT / "docs" / "concepts.md")
