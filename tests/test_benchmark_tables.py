"""The README's benchmark tables are the ones ``benchmarks/render.py`` makes from the result
files in ``benchmarks/results/``: a figure in the README always has its run beside it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _render_module():  # benchmarks/ is a folder of scripts, not a package
    spec = importlib.util.spec_from_file_location("benchmark_render", REPO / "benchmarks" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_tables_are_generated_from_the_result_files() -> None:
    render = _render_module()
    readme = (REPO / "README.md").read_text()
    assert render.BEGIN in readme and render.END in readme
    assert render.current(readme) == render.render().strip(), (
        "README.md's benchmark tables are out of date: run `python benchmarks/render.py README.md`"
    )


def test_every_linked_result_file_exists() -> None:
    render = _render_module()
    block = render.current((REPO / "README.md").read_text())
    for name in [part.split(")")[0] for part in block.split("(benchmarks/results/")[1:]]:
        assert (REPO / "benchmarks" / "results" / name).is_file(), name
