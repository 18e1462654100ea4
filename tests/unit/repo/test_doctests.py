"""The docstring examples of every package run and print what they claim.

A module of any installed package (pyproject.toml's source folders, found by discovery) is
collected when its source holds an example (``>>>``), so a module that gains examples, or a
package that gains a folder, is tested without listing it, and one whose examples doctest stops finding (a
docstring turned into a comment, say) fails instead of passing with nothing run.
"""

from __future__ import annotations

import doctest
import importlib

import pytest

from tests.conftest import REPO_ROOT
from tests.support.layout import FOLDERS, module_name

ROOT = REPO_ROOT


def _modules_with_examples() -> list[str]:
    names = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ">>> " in path.read_text():
                names.append(module_name(path))
    return names


MODULES = _modules_with_examples()


def test_examples_are_found_beyond_one_package() -> None:
    assert {"contract", "evaluation", "models"} <= {name.split(".")[1] for name in MODULES} and len(MODULES) > 20


@pytest.mark.parametrize("module_name", MODULES)
def test_doctests(module_name: str) -> None:
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{module_name} has examples in its source that doctest does not run"
    assert result.failed == 0
