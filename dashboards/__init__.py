"""Grafana dashboards as code: one module per dashboard, built with :mod:`iotwatch.dashboards.builder`.

``iotwatch dashboards build`` writes them to ``dashboards/json/`` (provisioned by
docker-compose); ``iotwatch dashboards push`` uploads them to a running Grafana.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The committed JSON, provisioned by docker-compose (deploy/grafana/provisioning/dashboards).
JSON_DIR = Path(__file__).resolve().parent / "json"


def build_all() -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON model, for every dashboard, in the order they are listed
    (imported here: the package's import stays light for ``dashboards push``)."""
    from iotwatch.dashboards import anomalies, device_drilldown, fleet_overview, gateway_health, oncall, vehicles

    built: dict[str, dict[str, Any]] = {}
    for module in (fleet_overview, anomalies, oncall, device_drilldown, vehicles, gateway_health):
        model = module.dashboard().to_dict()
        built[f"{model['uid']}.json"] = model
    return built


def render(model: dict[str, Any]) -> str:
    """The exact text written for a dashboard (stable key order, trailing newline)."""
    return json.dumps(model, indent=2, ensure_ascii=False) + "\n"


def write_all(out_dir: Path) -> list[Path]:
    """Write every dashboard's JSON into ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, model in build_all().items():
        path = out_dir / file_name
        path.write_text(render(model), encoding="utf-8")
        written.append(path)
    return written
