"""The docstring examples of the models package run and print what they claim."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import models

MODULES = sorted(m.name for m in pkgutil.walk_packages(models.__path__, "models."))


@pytest.mark.parametrize("module_name", MODULES)
def test_doctests(module_name: str) -> None:
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
