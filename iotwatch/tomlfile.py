"""Reading the operators' TOML files (routing, policies) with one-line errors that name the file and field."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from iotwatch.errors import IotwatchError

M = TypeVar("M", bound=BaseModel)


def load_model(path: Path, model: type[M], error: type[IotwatchError], what: str) -> M:
    """``path`` parsed as TOML and validated as ``model``; ``error`` naming the first problem."""
    return validate(read_toml(path, error, what), model, error, f"{what} {path}")


def read_toml(path: Path, error: type[IotwatchError], what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise error(f"{what} {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} {path} is not valid TOML: {exc}") from None


def validate(data: dict[str, Any], model: type[M], error: type[IotwatchError], where: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise error(f"{where}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
