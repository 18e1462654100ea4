"""The dashboard JSON: committed files equal the build, references resolve, layout is sane."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from iotwatch.application.cli import main
from iotwatch.dashboards import JSON_DIR, build_all, render
from iotwatch.dashboards.builder import DATASOURCE, FOLDER
from iotwatch.dashboards.queries import all_panels, is_builtin, queries, variables_used
from tests.conftest import REPO_ROOT

BUILT = build_all()
PROVISIONING = REPO_ROOT / "deploy" / "grafana" / "provisioning"


def walk(node: Any, path: str = "") -> Any:
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{path}.{key}", key, value
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{path}[{index}]")


def test_committed_json_is_what_build_produces() -> None:
    committed = {p.name: p.read_text(encoding="utf-8") for p in JSON_DIR.glob("*.json")}
    assert set(committed) == set(BUILT), "run: iotwatch dashboards build"
    for name, model in BUILT.items():
        assert committed[name] == render(model), f"{name} is stale: run iotwatch dashboards build"


def test_build_command_writes_the_same_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["dashboards", "build", "--out", str(tmp_path / "out"), "--json"])  # returns on success
    result = json.loads(capsys.readouterr().out)
    assert sorted(result["files"]) == sorted(BUILT)
    for name, model in BUILT.items():
        assert (tmp_path / "out" / name).read_text(encoding="utf-8") == render(model)


def test_uids_and_panel_ids_are_unique() -> None:
    uids = [model["uid"] for model in BUILT.values()]
    assert len(uids) == len(set(uids)) == 6
    assert all(len(uid) <= 40 for uid in uids)
    for model in BUILT.values():
        ids = [panel["id"] for panel in all_panels(model)]
        assert len(ids) == len(set(ids)), model["uid"]
        titles = [panel["title"] for panel in all_panels(model)]
        assert len(titles) == len(set(titles)), f"{model['uid']}: panel titles repeat"


def test_every_datasource_reference_is_the_provisioned_influxdb() -> None:
    provisioned = yaml.safe_load((PROVISIONING / "datasources" / "influxdb.yml").read_text())["datasources"][0]
    assert (provisioned["type"], provisioned["uid"]) == (DATASOURCE["type"], DATASOURCE["uid"])
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "iotwatch.yml").read_text())["providers"][0]
    assert provider["folder"] == FOLDER
    for model in BUILT.values():
        refs = [(path, value) for path, key, value in walk(model) if key == "datasource"]
        assert refs
        for path, value in refs:
            if value == {"type": "grafana", "uid": "-- Grafana --"}:
                assert path.startswith(".annotations.list[0]")  # Grafana's built-in annotations
                continue
            assert value == DATASOURCE, f"{model['uid']}{path}"


def test_every_variable_used_is_defined() -> None:
    for model in BUILT.values():
        defined = {v["name"] for v in model["templating"]["list"]}
        texts = [q for _, q in queries(model)]
        for panel in all_panels(model):
            texts += [panel["title"], panel.get("repeat") and f"${panel['repeat']}" or ""]
            texts += [t.get("alias", "") for t in panel.get("targets", [])]
        used = {name for text in texts for name in variables_used(text) if not is_builtin(name)}
        assert used <= defined, f"{model['uid']}: undefined {used - defined}"
        # Chained variables only refer to variables defined before them.
        seen: set[str] = set()
        for variable in model["templating"]["list"]:
            refs = {n for n in variables_used(variable["query"]) if not is_builtin(n)}
            assert refs <= seen, f"{model['uid']}: ${variable['name']} refers to {refs - seen} defined later"
            seen.add(variable["name"])


def test_every_panel_has_a_raw_influxql_target() -> None:
    for model in BUILT.values():
        panels = [p for p in all_panels(model) if p["type"] != "row"]
        assert panels
        for panel in panels:
            assert panel["targets"], f"{model['uid']}: {panel['title']} has no target"
            for target in panel["targets"]:
                assert target["rawQuery"] is True and target["query"].upper().startswith("SELECT ")
                assert "$timeFilter" in target["query"], f"{panel['title']}: unbounded query"
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs))


def test_panel_types_units_and_thresholds() -> None:
    types = {p["type"] for model in BUILT.values() for p in all_panels(model)}
    assert {"timeseries", "stat", "table", "bargauge", "geomap", "row"} <= types
    for model in BUILT.values():
        for panel in all_panels(model):
            if panel["type"] == "row":
                continue
            steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
            assert steps[0]["value"] is None
            values = [s["value"] for s in steps[1:]]
            assert values == sorted(values), f"{panel['title']}: thresholds out of order"


def test_layout_fits_the_grid_without_overlap() -> None:
    for model in BUILT.values():
        cells: set[tuple[int, int]] = set()
        for panel in model["panels"]:  # top level (collapsed rows' panels are laid out when expanded)
            grid = panel["gridPos"]
            assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24
            area = {
                (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
            }
            assert not area & cells, f"{model['uid']}: {panel['title']} overlaps"
            cells |= area


def test_queries_avoid_what_influxdb_3_influxql_lacks() -> None:
    unsupported = (
        "SLIMIT",
        "SOFFSET",
        "INTEGRAL(",
        "SAMPLE(",
        "SHOW SERIES",
        "SHOW DATABASES",
        "HOLT_WINTERS",
        "EXPONENTIAL_MOVING_AVERAGE",
        "INTO ",
    )
    for model in BUILT.values():
        for where, query in queries(model):
            assert not [word for word in unsupported if word in query.upper()], f"{model['uid']} {where}"
