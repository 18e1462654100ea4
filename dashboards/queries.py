"""Every InfluxQL query a dashboard runs (variables, annotations, panel targets), Grafana's
variable substitution, and a check that each query returns data.

The tests run the check against a database a short pipeline run filled; ``iotwatch demo``
runs it against its own InfluxDB after the run, with the variables set to what the run
produced (a site, a device that raised an alert, the vehicles, the gateway instance).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: Variables Grafana defines itself.
BUILTINS = {
    "timeFilter",
    "__interval",
    "__interval_ms",
    "__range",
    "__from",
    "__to",
    "__timeFilter",
    "tag_",
    "col",
    "m",
}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
#: What Grafana sends for ``$timeFilter`` with the dashboards' default range (last 6 hours).
DEFAULT_TIME_FILTER = "time > now() - 6h"


def all_panels(model: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in model["panels"]:
        yield panel
        yield from panel.get("panels", [])  # inside collapsed rows


def queries(model: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, InfluxQL) for every query the dashboard runs."""
    for variable in model["templating"]["list"]:
        yield f"variable {variable['name']}", variable["query"]
    for annotation in model["annotations"]["list"]:
        if "query" in annotation:
            yield f"annotation {annotation['name']}", annotation["query"]
    for panel in all_panels(model):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["query"]


def variables_used(text: str) -> set[str]:
    names = set()
    for braced, plain in VARIABLE.findall(text):
        names.add(braced or plain)
    return names


def is_builtin(name: str) -> bool:
    return name in BUILTINS or name.startswith("tag_") or name.startswith("__")


def _duration(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def substitute(
    query: str, values: Mapping[str, str], time_filter: str = DEFAULT_TIME_FILTER, interval_ms: int = 60_000
) -> str:
    """Grafana's interpolation: ``$timeFilter`` and ``$__interval`` fixed, dashboard variables
    from ``values`` (a multi-value selection given as a regex alternation, as Grafana formats it)."""
    text = query.replace("$timeFilter", time_filter)
    text = text.replace("$__interval_ms", str(interval_ms)).replace("$__interval", _duration(interval_ms))

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {query!r}")
        return values[name]

    return VARIABLE.sub(one, text)


def alternation(values: Sequence[str]) -> str:
    """A multi-value selection as Grafana formats it for a regex: ``(a|b)``."""
    return "(" + "|".join(values) + ")"


@dataclass(frozen=True)
class Picks:
    """The variable values an operator would pick. Single-value pickers (the device
    drill-down): a site, one of its devices and a metric of it. Multi-value pickers open on
    All: every site (``sites``, default just ``site``); the only multi-value device picker
    is the vehicles dashboard's, which gets ``vehicles``. The gateway instance."""

    site: str
    device: str
    metric: str
    instance: str
    vehicles: Sequence[str]
    sites: Sequence[str] = ()

    def values(self, model: dict[str, Any]) -> dict[str, str]:
        """Variable values for one dashboard's JSON model."""
        multi = {v["name"] for v in model["templating"]["list"] if v.get("multi")}
        values = {"site": self.site, "device": self.device, "metric": self.metric, "instance": self.instance}
        if "site" in multi:
            values["site"] = alternation(self.sites or [self.site])
        if "device" in multi:
            values["device"] = alternation(self.vehicles)
        return values


def has_data(series: Iterable[dict[str, Any]]) -> bool:
    """Whether a query's series hold at least one non-null value (besides the time column)."""
    return any(value is not None for s in series for row in s.get("values", []) for value in row[1:])


@dataclass(frozen=True)
class QueryCheck:
    dashboard: str  # uid
    where: str  # "panel 'Title' A", "variable site", "annotation Crashes"
    query: str  # as sent
    has_data: bool
    error: str | None = None

    @property
    def name(self) -> str:
        return f"{self.dashboard}: {self.where}"


def check_all(
    models: Iterable[dict[str, Any]],
    picks: Picks,
    run: Callable[[str], list[dict[str, Any]]],
    time_filter: str = DEFAULT_TIME_FILTER,
) -> list[QueryCheck]:
    """Run every query of every dashboard with ``run`` (InfluxQL -> series); a query that
    fails is recorded with its error, not raised."""
    checks = []
    for model in models:
        values = picks.values(model)
        for where, query in queries(model):
            text = substitute(query, values, time_filter)
            try:
                checks.append(QueryCheck(model["uid"], where, text, has_data(run(text))))
            except Exception as exc:
                checks.append(QueryCheck(model["uid"], where, text, False, f"{type(exc).__name__}: {exc}"))
    return checks


def summarise(checks: Sequence[QueryCheck], picks: Picks) -> dict[str, Any]:
    """Counts, the queries without data and the variable values used (JSON-ready)."""
    return {
        "queries_checked": len(checks),
        "queries_with_data": sum(c.has_data for c in checks),
        "dashboards": len({c.dashboard for c in checks}),
        "empty": [c.name for c in checks if not c.has_data and c.error is None],
        "errors": {c.name: c.error for c in checks if c.error is not None},
        "values": {**asdict(picks), "vehicles": list(picks.vehicles), "sites": list(picks.sites)},
    }
