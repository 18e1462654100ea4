"""The documentation site's hook (``hooks`` in mkdocs.yml): the result files the benchmarks
page links are served with the site, so a link ``../benchmarks/results/<name>`` resolves on
the site as it does in the repository, and ``mkdocs build --strict`` checks each one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

#: The result files (application/bench/record.py writes them).
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def on_files(files: Files, config: Any) -> Files:
    """``files`` and every result file, at ``benchmarks/results/<name>`` on the site."""
    for path in sorted(RESULTS.glob("*.json")):
        source = f"../benchmarks/results/{path.name}"
        dest = f"benchmarks/results/{path.name}"
        # included explicitly: the site's default exclusions (``.*``) would match the ``..``
        site = (config["docs_dir"], config["site_dir"], config["use_directory_urls"])
        files.append(File(source, *site, dest_uri=dest, inclusion=InclusionLevel.INCLUDED))
    return files
