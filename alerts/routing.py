"""The routing file of ``alerts forward``: receivers and a policy tree, as Grafana's
notification policies (and Alertmanager's routes) work; docs/operate/oncall.md documents the
file. ``alerts forward --webhook URL`` is the tree of one ``record`` receiver
(:func:`single_receiver`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from iotwatch.alerts.records import parse_duration
from iotwatch.contract.alerts import AlertRecord
from iotwatch.errors import IotwatchError, UserError
from iotwatch.tomlfile import read_toml, validate

#: Alert fields a policy may match on and group by.
LABELS = ("site", "device_id", "device_type", "rule", "severity", "detector", "metric")


class RoutingError(IotwatchError):
    """The routing file cannot be used."""


class Receiver(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    format: Literal["json", "slack", "record", "pagerduty", "alertmanager"] = "json"
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(10.0, gt=0)
    #: ``pagerduty``: the Events API v2 integration key of the service (required)
    routing_key: str | None = None
    #: ``alertmanager``: each alert's ``generatorURL`` (e.g. the Grafana dashboard); a firing
    #: alert's ``endsAt`` is this far ahead, renewed with every notification of its group
    generator_url: str | None = None
    resolve_after: float = 24 * 3600.0

    _resolve_after = field_validator("resolve_after", mode="before")(lambda cls, v: parse_duration(v))

    @model_validator(mode="after")
    def _format_needs(self) -> Receiver:
        if self.format == "pagerduty" and not self.routing_key:
            raise UserError("a pagerduty receiver needs routing_key (the service's Events API v2 integration key)")
        return self

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise UserError(f"{value!r} is not an http(s) URL")
        return value


def _seconds(value: Any) -> float | None:
    return None if value is None else parse_duration(value)


class Policy(BaseModel):
    """One node of the tree; unset timing and grouping come from the parent."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    receiver: str | None = None
    match: dict[str, str | list[str]] = Field(default_factory=dict)
    continue_: bool = Field(False, alias="continue")
    group_by: list[str] | None = None
    group_wait: float | None = None
    group_interval: float | None = None
    repeat_interval: float | None = None
    routes: list[Policy] = Field(default_factory=list)

    _durations = field_validator("group_wait", "group_interval", "repeat_interval", mode="before")(
        lambda cls, v: _seconds(v)
    )

    @field_validator("match", "group_by")
    @classmethod
    def _labels(cls, value: Any) -> Any:
        names = value if isinstance(value, list) else list(value or {})
        unknown = [n for n in names if n not in LABELS]
        if unknown:
            raise UserError(f"unknown alert field(s) {unknown}; use {', '.join(LABELS)}")
        return value

    def matches(self, alert: AlertRecord) -> bool:
        for name, wanted in self.match.items():
            allowed = [wanted] if isinstance(wanted, str) else wanted
            if alert.field(name) not in allowed:
                return False
        return True


@dataclass(frozen=True)
class Route:
    """Where one alert goes: a receiver, with the grouping and timing that apply there."""

    path: str  # e.g. "0.1": which policy (for the group key: two policies never share groups)
    receiver: str
    group_by: tuple[str, ...]
    group_wait_s: float
    group_interval_s: float
    repeat_interval_s: float

    def group_key(self, alert: AlertRecord) -> str:
        labels = ",".join(f"{name}={alert.field(name)}" for name in self.group_by)
        return f"{self.path}:{{{labels}}}"


DEFAULTS = {"group_by": ["site", "rule"], "group_wait": 10.0, "group_interval": 60.0, "repeat_interval": 4 * 3600.0}


@dataclass(frozen=True)
class RoutingTree:
    receivers: dict[str, Receiver]
    root: Policy

    @property
    def record_receiver(self) -> str | None:
        """The receiver that takes every record routed to it one by one, if any."""
        return next((name for name, r in self.receivers.items() if r.format == "record"), None)

    def routes(self, alert: AlertRecord) -> list[Route]:
        """Every route ``alert`` takes (one per receiver it goes to; several with ``continue``)."""
        found: list[Route] = []
        self._walk(self.root, "0", alert, dict(DEFAULTS), found)
        return found

    def _walk(
        self, policy: Policy, path: str, alert: AlertRecord, inherited: dict[str, Any], found: list[Route]
    ) -> None:
        settings = {**inherited, **{k: getattr(policy, k) for k in DEFAULTS if getattr(policy, k) is not None}}
        receiver = policy.receiver or inherited.get("receiver")
        settings["receiver"] = receiver
        taken = False
        for n, child in enumerate(policy.routes):
            if child.matches(alert):
                self._walk(child, f"{path}.{n}", alert, settings, found)
                taken = True
                if not child.continue_:
                    break
        if not taken:
            found.append(
                Route(
                    path,
                    str(receiver),
                    tuple(settings["group_by"]),
                    settings["group_wait"],
                    settings["group_interval"],
                    settings["repeat_interval"],
                )
            )


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    receivers: dict[str, Receiver]
    route: Policy


def load_routing(path: Path) -> RoutingTree:
    """The routing tree in ``path``; :class:`RoutingError` naming the first problem."""
    return parse_routing(read_toml(path, RoutingError, "routing file"), f"routing file {path}")


def parse_routing(data: dict[str, Any], where: str = "routing") -> RoutingTree:
    parsed = validate(data, _File, RoutingError, where)
    if parsed.route.receiver is None:
        raise RoutingError(f"{where}: route.receiver: the root policy needs a receiver")
    missing = sorted(_receivers(parsed.route) - set(parsed.receivers))
    if missing:
        raise RoutingError(f"{where}: policies name receivers that are not defined: {', '.join(missing)}")
    records = sorted(name for name, r in parsed.receivers.items() if r.format == "record")
    if len(records) > 1:
        raise RoutingError(
            f"{where}: receivers {', '.join(records)} all take records; one may (its progress is the consumer group)"
        )
    return RoutingTree(parsed.receivers, parsed.route)


def _receivers(policy: Policy) -> set[str]:
    names = {policy.receiver} if policy.receiver else set()
    for child in policy.routes:
        names |= _receivers(child)
    return names


def single_receiver(url: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> RoutingTree:
    """The tree of ``alerts forward --webhook URL``: every alert record to one ``record`` receiver."""
    return parse_routing(
        {
            "receivers": {
                "webhook": {"url": url, "format": "record", "headers": headers or {}, "timeout_s": timeout_s}
            },
            "route": {"receiver": "webhook"},
        },
        "--webhook",
    )
