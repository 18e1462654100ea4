"""Every InfluxQL query in a dashboard's JSON model (panels, variables, annotations), and
Grafana's variable substitution as far as the tests need it."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

#: Variables Grafana defines itself.
BUILTINS = {"timeFilter", "__interval", "__interval_ms", "__range", "__from", "__to", "__timeFilter", "tag_", "col",
            "m"}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


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


def substitute(query: str, values: Mapping[str, str]) -> str:
    """Grafana's interpolation for the test: time filter and interval fixed, variables from
    ``values`` (a multi-value selection is given as a regex alternation, as Grafana formats it)."""
    text = query.replace("$timeFilter", "time > now() - 6h")
    text = text.replace("$__interval_ms", "60000").replace("$__interval", "1m")

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no test value for ${name} in {query!r}")
        return values[name]

    return VARIABLE.sub(one, text)
