"""The dashboards read only what the contract says the stages write
(:mod:`iotwatch.contract.measurements`), and the writers cannot write anything else."""

from __future__ import annotations

import re

import pytest

from iotwatch.contract.measurements import DEVICE_METRICS, MEASUREMENTS, PIPELINE
from iotwatch.dashboards import build_all
from iotwatch.dashboards.queries import queries

QUOTED = re.compile(r'"([^"]+)"')
#: A quoted name compared in WHERE, or listed in GROUP BY: a tag.
AS_TAG = re.compile(r'"([^"]+)"\s*(?:=~|!=|=|<>)|GROUP BY [^()]*?"([^"]+)"')


def test_every_dashboard_query_names_only_contract_measurements_tags_and_fields() -> None:
    checked = 0
    for uid, model in build_all().items():
        for where, query in queries(model):
            measured = re.findall(r'FROM "(\w+)"', query)
            assert measured, f"{uid} {where}: no measurement in {query}"
            unknown_measurements = [m for m in measured if m not in MEASUREMENTS]
            assert not unknown_measurements, f"{uid} {where}: {unknown_measurements} are not in the contract"
            used = [MEASUREMENTS[m] for m in measured]
            tags = set().union(*(m.tags for m in used))
            fields = set().union(*(m.fields for m in used))
            aliases = set(re.findall(r'AS "([^"]+)"', query))
            as_tags = {a or b for a, b in AS_TAG.findall(query)} - aliases
            assert as_tags <= tags, f"{uid} {where}: {sorted(as_tags - tags)} are not tags of {measured}"
            names = set(QUOTED.findall(query)) - set(measured) - aliases - as_tags
            if not any(m.open_fields for m in used):
                assert names <= tags | fields, f"{uid} {where}: {sorted(names - tags - fields)} not in {measured}"
            checked += 1
    assert checked > 50  # (the walk found the dashboards' queries)


def test_a_point_with_a_name_outside_the_contract_is_refused_where_it_is_written() -> None:
    with pytest.raises(ValueError, match="no field"):
        DEVICE_METRICS.point({"site": "s"}, {"average": 1.0}, 0)
    with pytest.raises(ValueError, match="no tag"):
        PIPELINE.point({"instance": "g"}, {"anything": 1}, 0)
    assert PIPELINE.point({"stage": "stream"}, {"anything": 1}, 0).to_line_protocol().startswith("pipeline,stage=")
