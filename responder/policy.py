"""The policy file of ``iotwatch respond``: which rule's alerts send which command.

TOML::

    [[policies]]
    name = "reset-stuck-hvac"      # the audit trail and command ids name it
    rule = "stuck_hvac"            # alerts of this rule ...
    device_type = "thermostat"     # ... of this device type (optional)
    command = "reset_hvac"         # are answered with this command to the alerting device
    args = {}                      # its arguments
    ttl = "2m"                     # optional: the command is void after this (default IOTWATCH_RESPOND_COMMAND_TTL_S)

Without a file, :data:`DEFAULT_POLICIES` apply (stuck HVAC -> reset, water leak -> close the valve).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from alerts.records import parse_duration
from iotwatch.errors import IotwatchError
from iotwatch.tomlfile import load_model


class PolicyError(IotwatchError):
    """The policy file cannot be used."""


class CommandPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    rule: str
    command: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
    device_type: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    ttl: float | None = None

    @field_validator("ttl", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float | None:
        return None if value is None else parse_duration(value)

    def applies_to(self, alert: dict[str, Any]) -> bool:
        return alert.get("rule") == self.rule and self.device_type in (None, alert.get("device_type"))


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policies: list[CommandPolicy]


DEFAULT_POLICIES = (
    CommandPolicy(name="reset-stuck-hvac", rule="stuck_hvac", device_type="thermostat", command="reset_hvac"),
    CommandPolicy(name="close-valve-on-leak", rule="water_leak", device_type="leak_sensor", command="close_valve"),
)


def load_policies(path: Path | None) -> tuple[CommandPolicy, ...]:
    if path is None:
        return DEFAULT_POLICIES
    policies = tuple(load_model(path, _File, PolicyError, "policy file").policies)
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise PolicyError(f"policy file {path}: policy names must be unique")
    return policies
