"""The policy file of ``iotwatch respond``: which rule's alerts send which command
(docs/operate/oncall.md, "The policy file").

Without a file, :data:`DEFAULT_POLICIES` apply (stuck HVAC -> reset, water leak -> close the valve,
coolant overheating -> limp mode, crash -> emergency notification).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from iotwatch.alerts.records import parse_duration
from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.metric_catalog import DANGER_LIMITS
from iotwatch.errors import IotwatchError, UserError
from iotwatch.tomlfile import load_model


class PolicyError(IotwatchError):
    """The policy file cannot be used."""


class CommandPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    rule: str
    #: ``command``: send ``command`` to the device; ``emergency``: write an emergency notification record
    action: Literal["command", "emergency"] = "command"
    command: str = Field("", pattern=r"^([A-Za-z0-9][A-Za-z0-9_.:-]*)?$")
    device_type: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    ttl: float | None = None
    metric: str | None = None
    above: float | None = None

    @model_validator(mode="after")
    def _command_given(self) -> CommandPolicy:
        if self.action == "command" and not self.command:
            raise UserError(f"policy {self.name}: a command policy needs a command")
        return self

    @field_validator("ttl", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float | None:
        return None if value is None else parse_duration(value)

    def applies_to(self, alert: AlertRecord) -> bool:
        if alert.rule != self.rule or self.device_type not in (None, alert.device_type):
            return False
        if self.metric is not None and alert.metric != self.metric:
            return False
        value = alert.value
        return self.above is None or (isinstance(value, int | float) and value > self.above)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policies: list[CommandPolicy]


#: Coolant above this (degC) is overheating (normal running is 88-92): the catalogue's warning
#: limit, where the ``coolant_overheating`` rule raises.
OVERHEAT_C = DANGER_LIMITS["vehicle_edr"]["coolant_temp_c"].warning

DEFAULT_POLICIES = (
    CommandPolicy(name="reset-stuck-hvac", rule="stuck_hvac", device_type="thermostat", command="reset_hvac"),
    CommandPolicy(name="close-valve-on-leak", rule="water_leak", device_type="leak_sensor", command="close_valve"),
    CommandPolicy(
        name="limp-mode-on-overheating", rule="coolant_overheating", device_type="vehicle_edr", command="limp_mode"
    ),
    CommandPolicy(name="emergency-on-crash", rule="crash", device_type="vehicle_edr", action="emergency"),
)


def load_policies(path: Path | None) -> tuple[CommandPolicy, ...]:
    if path is None:
        return DEFAULT_POLICIES
    policies = tuple(load_model(path, _File, PolicyError, "policy file").policies)
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise PolicyError(f"policy file {path}: policy names must be unique")
    return policies
