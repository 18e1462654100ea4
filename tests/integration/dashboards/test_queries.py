"""Every dashboard query returns data from a real pipeline run, on the real InfluxDB (1.6).

One short run of the streaming job (the streaming tests' scenario plus a GPS vehicle) and
a few gateway status reports fill a fresh database; then each panel, variable and
annotation query is run with Grafana's variables substituted as a user would pick them.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from iotwatch.clients.influx import InfluxV1Client
from iotwatch.dashboards import build_all
from iotwatch.dashboards.queries import Picks, has_data, queries, substitute
from iotwatch.settings import Settings
from tests.support.pipeline_data import DashboardData, populate

pytestmark = pytest.mark.slow

BUILT = build_all()
CASES = [
    pytest.param(name, where, query, id=f"{model['uid']}: {where}")
    for name, model in BUILT.items()
    for where, query in queries(model)
]


@pytest.fixture(scope="module")
def data(spark: Any, stack_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> DashboardData:
    if not stack_settings.influx.enabled:
        pytest.fail("the embedded stack runs without InfluxDB (influxd not installed)")
    return populate(spark, stack_settings, uuid.uuid4().hex[:10], Path(tmp_path_factory.mktemp("dashboards")))


@pytest.fixture(scope="module")
def influx(data: DashboardData) -> Any:
    client = InfluxV1Client(data.settings.influx)
    yield client
    client.close()


def values_for(data: DashboardData, model: dict[str, Any]) -> dict[str, str]:
    """The variable values a user would pick; a multi-value pick as Grafana formats it for regexes."""
    return Picks(data.site, data.device, data.metric, data.instance, data.vehicles).values(model)


@pytest.mark.parametrize(("dashboard_file", "where", "query"), CASES)
def test_query_returns_data(
    data: DashboardData, influx: InfluxV1Client, dashboard_file: str, where: str, query: str
) -> None:
    text = substitute(query, values_for(data, BUILT[dashboard_file]))
    series = influx.query(text)
    assert series, f"no data for {where}: {text}"
    assert has_data(series), f"only nulls for {where}: {text}"


def test_the_data_behind_the_key_panels(data: DashboardData, influx: InfluxV1Client) -> None:
    """Spot checks that the queries return the right things, not just something."""
    models = {m["uid"]: m for m in BUILT.values()}

    def run(uid: str, where: str) -> list[dict[str, Any]]:
        query = dict(queries(models[uid]))[where]
        return influx.query(substitute(query, values_for(data, models[uid])))

    # Open alerts: the leak sensor left wet at the end of the run is raised and never cleared.
    table = run("iotwatch-anomalies", "panel 'Open alerts' A")[0]
    open_alerts = [dict(zip(table["columns"], row, strict=True)) for row in table["values"]]
    assert any(a["rule"] == "water_leak" and a["device_id"].startswith("wet-") for a in open_alerts), open_alerts
    # Crash markers: the crash car's alert, with the deceleration that triggered it.
    crashes = run("iotwatch-vehicles", "annotation Crashes")[0]
    assert [row[2] for row in crashes["values"]] == [data.vehicles[0]]
    # Positions: latitude per interval for the GPS vehicle only.
    (lat,) = run("iotwatch-vehicles", "panel 'Positions' A")
    assert lat["tags"] == {"device_id": data.vehicles[1]} and 38.7 < lat["values"][0][1] < 38.8
    # Gateway counters: a rate per second, from cumulative counters (600 received per minute).
    (received,) = run("iotwatch-gateway", "panel 'Received and forwarded' A")
    assert received["values"] and all(row[1] == pytest.approx(10.0) for row in received["values"])
    # Dead letters by reason, restart-safe increase: both reasons seen.
    reasons = {s["tags"]["reason"] for s in run("iotwatch-gateway", "panel 'Dead letters by reason (time range)' A")}
    assert reasons == {"invalid_json", "missing_field"}
    # On-call: the acknowledged alert is no longer open; its time to acknowledge; clears by acked or not.
    (acknowledged,) = run("iotwatch-oncall", "panel 'Acknowledged, still firing' A")
    assert acknowledged["values"][-1][1] == 1
    (acks,) = run("iotwatch-oncall", "panel 'Recent acknowledgements' A")
    row = dict(zip(acks["columns"], acks["values"][0], strict=True))
    assert row["by"] == "alice" and row["seconds_to_ack"] > 0
    cleared = run("iotwatch-oncall", "panel 'Time to clear' A")
    assert {s["tags"]["acked"] for s in cleared} == {"false"} and all(v[1] >= 0 for s in cleared for v in s["values"])
