"""The benchmarks page's tables and the README's headline table are the ones
``application/bench/render.py`` makes from the result files in ``benchmarks/results/``: a figure in
the documentation always has its run beside it."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO_ROOT

REPO = REPO_ROOT


def _render_module():  # benchmarks/ is a folder of scripts, not a package
    spec = importlib.util.spec_from_file_location("benchmark_render", REPO / "benchmarks" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_and_the_readme_are_generated_from_the_result_files() -> None:
    render = _render_module()
    page = render.PAGE.read_text()
    assert render.current(page) == render.render().strip() != "", (
        "docs/benchmarks.md's tables are out of date: run `python application/bench/render.py`"
    )
    readme = render.README.read_text()
    assert render.current(readme, render.HEADLINE_BEGIN, render.HEADLINE_END) == render.headline().strip(), (
        "README.md's headline figures are out of date: run `python application/bench/render.py`"
    )
    assert render.BEGIN not in readme, "the full tables live on the benchmarks page, not in the README"


def test_every_linked_result_file_exists() -> None:
    render = _render_module()
    block = render.current(render.PAGE.read_text())
    names = [part.split(")")[0] for part in block.split(f"({render.RESULTS_URL}")[1:]]
    assert names
    for name in names:
        assert (render.RESULTS / name).is_file(), name
