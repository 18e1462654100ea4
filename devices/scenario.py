"""Scenario files: anomalies and faults planned at given times for chosen devices (docs/internals.md,
"Scenario files")."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from iotwatch.devices.anomaly_kinds import resolve_kind
from iotwatch.errors import IotwatchError

__all__ = ["Scenario", "ScenarioEntry", "ScenarioError", "load_scenario"]


class ScenarioError(IotwatchError):
    """The scenario file cannot be used."""


class ScenarioEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    devices: str | list[str] = "*"
    device_type: str | None = None
    fraction: float = Field(1.0, gt=0.0, le=1.0)
    at_s: float = Field(0.0, ge=0.0)
    duration_s: float | None = Field(None, ge=0.0)
    metric: str | None = None
    magnitude: float | None = None
    copies: int | None = Field(None, ge=1, le=10)
    depth: int | None = Field(None, ge=1, le=100)
    delay_s: float | None = Field(None, ge=0.0)
    skew_s: float | None = None
    variant: str | None = None

    def matches(self, device_id: str, device_type: str) -> bool:
        if self.device_type is not None and self.device_type != device_type:
            return False
        patterns = [self.devices] if isinstance(self.devices, str) else self.devices
        return any(fnmatch.fnmatchcase(device_id, p) for p in patterns)

    def params(self) -> dict[str, Any]:
        keys = ("metric", "magnitude", "copies", "depth", "delay_s", "skew_s", "variant")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    anomalies: list[ScenarioEntry] = []


def load_scenario(path: Path) -> Scenario:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(f"scenario {path}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(raw.decode()) if path.suffix.lower() == ".toml" else json.loads(raw)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ScenarioError(f"scenario {path} is not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}") from None
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ScenarioError(f"scenario {path}: {where}: {first['msg']}") from None
    for n, entry in enumerate(scenario.anomalies):
        try:
            resolve_kind(entry.kind)
        except ValueError as exc:
            raise ScenarioError(f"scenario {path}: anomalies.{n}: {exc}") from None
    return scenario
