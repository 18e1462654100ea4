"""The benchmarks page's tables and the README's headline table are the ones
``application/bench/render.py`` makes from the result files in ``benchmarks/results/``: a figure in
the documentation always has its run beside it."""

from __future__ import annotations

from iotwatch.application.bench import render as render_module


def test_the_page_and_the_readme_are_generated_from_the_result_files() -> None:
    render = render_module
    page = render.PAGE.read_text()
    assert render.TABLES.current(page) == render.TABLES.expected() and render.render(), (
        "docs/benchmarks.md's tables are out of date: run `python application/bench/render.py`"
    )
    readme = render.README.read_text()
    assert render.HEADLINE.current(readme) == render.HEADLINE.expected(), (
        "README.md's headline figures are out of date: run `python application/bench/render.py`"
    )
    assert render.BEGIN not in readme, "the full tables live on the benchmarks page, not in the README"


def test_every_linked_result_file_exists() -> None:
    render = render_module
    block = render.TABLES.current(render.PAGE.read_text()) or ""
    names = [part.split(")")[0] for part in block.split(f"({render.RESULTS_LINK}")[1:]]
    assert names
    for name in names:
        assert (render.RESULTS / name).is_file(), name


def test_every_result_file_is_cited_by_a_page() -> None:
    """A result file no page cites is dropped (git keeps it): the folder holds the evidence of
    the figures the documents show, not every run."""
    render = render_module
    pages = "\n".join(p.read_text() for p in [render.README, *(render.REPO / "docs").rglob("*.md")])
    uncited = [path.name for path in sorted(render.RESULTS.glob("*.json")) if path.stem not in pages]
    assert not uncited, f"result files no page cites (git rm them): {uncited}"
