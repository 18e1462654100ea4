"""``iotwatch dashboards push`` over real HTTP, against a stand-in for Grafana.

tests/support/fake_grafana.py is NOT Grafana (none can run here): it answers the
endpoints the push uses as Grafana's HTTP API does and records the calls, so what is
tested is the push logic and grafana-client's real requests, not Grafana's acceptance of
the dashboard JSON.
"""

from __future__ import annotations

import json
import socket

import pytest
from pydantic import SecretStr

from iotwatch.application.cli import main
from iotwatch.dashboards import build_all
from iotwatch.dashboards.push import DATASOURCE_NAME, connect, push
from iotwatch.errors import IotwatchError
from iotwatch.settings import InfluxSettings
from tests.support.fake_grafana import FakeGrafana

TOKEN = "glsa_test_token"
INFLUX = InfluxSettings(url="http://influxdb:8086", database="iotwatch", token=SecretStr("influx-secret"))


def test_push_creates_folder_datasource_and_dashboards_then_updates_them_idempotently() -> None:
    built = build_all()
    with FakeGrafana(TOKEN) as grafana:
        first = push(connect(grafana.url, TOKEN), folder="IoT Watch", influx=INFLUX)
        state = grafana.state
        assert list(state.folders) == ["iot-watch"] and state.folders["iot-watch"]["title"] == "IoT Watch"
        assert first.datasource and first.datasource["action"] == "created"
        ds = state.datasources["iotwatch-influxdb"]
        assert (ds["type"], ds["name"], ds["url"], ds["jsonData"]["dbName"]) == (
            "influxdb",
            DATASOURCE_NAME,
            "http://influxdb:8086",
            "iotwatch",
        )
        sent = grafana.calls("POST", "/api/datasources")[0].body
        assert sent["secureJsonData"] == {"httpHeaderValue1": "Token influx-secret"}
        assert sent["jsonData"]["httpHeaderName1"] == "Authorization"
        assert set(state.dashboards) == {m["uid"] for m in built.values()}
        for model in built.values():
            stored = state.dashboards[model["uid"]]
            assert stored["folderUid"] == "iot-watch" and stored["version"] == 1
            assert stored["dashboard"] == {**model, "id": None}
        assert all(c.authorization == f"Bearer {TOKEN}" for c in state.calls)

        calls_before = len(state.calls)
        second = push(connect(grafana.url, TOKEN), folder="IoT Watch", influx=INFLUX)
        again = state.calls[calls_before:]
        assert not [c for c in again if c.method == "POST" and c.path == "/api/folders"]  # folder reused
        assert [c.method for c in again if c.path.startswith("/api/datasources")] == ["GET", "PUT"]
        assert second.datasource and second.datasource["action"] == "updated"
        posts = [c.body for c in again if c.path == "/api/dashboards/db"]
        assert len(posts) == len(built) and all(p["overwrite"] is True for p in posts)
        assert {d["version"] for d in second.dashboards} == {2} and len(state.dashboards) == len(built)
        assert list(state.folders) == ["iot-watch"] and len(state.datasources) == 1


def test_an_existing_folder_with_the_same_title_is_reused() -> None:
    with FakeGrafana(TOKEN) as grafana:
        grafana.state.folders["abc123"] = {"id": 7, "uid": "abc123", "title": "iotwatch"}
        result = push(connect(grafana.url, TOKEN), folder="iotwatch", influx=None)
        assert result.folder["uid"] == "abc123" and result.datasource is None
        assert not grafana.calls("POST", "/api/folders") and not grafana.calls(prefix="/api/datasources")
        assert {d["folderUid"] for d in grafana.state.dashboards.values()} == {"abc123"}


def test_cli_push_json_and_one_line_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("IOTWATCH_INFLUX_TOKEN", "IOTWATCH_INFLUX_USERNAME", "IOTWATCH_INFLUX_PASSWORD", "GRAFANA_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with FakeGrafana(TOKEN) as grafana:
        main(
            [
                "dashboards",
                "push",
                "--url",
                grafana.url,
                "--token",
                TOKEN,
                "--influx-url",
                "http://influx:8086",
                "--database",
                "metrics",
                "--json",
            ]
        )
        result = json.loads(capsys.readouterr().out)
        assert result["folder"]["title"] == "iotwatch" and result["datasource"]["action"] == "created"
        assert grafana.state.datasources["iotwatch-influxdb"]["database"] == "metrics"
        assert {d["status"] for d in result["dashboards"]} == {"success"}

        monkeypatch.setenv("GRAFANA_TOKEN", "wrong")
        with pytest.raises(SystemExit) as exit_info:
            main(["dashboards", "push", "--url", grafana.url, "--no-datasource"])
        assert exit_info.value.code == 1
        err = capsys.readouterr().err
        assert err.startswith("iotwatch: error: Grafana refused the request: Unauthorized") and err.count("\n") == 1


def test_unreachable_grafana_is_a_clear_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(IotwatchError) as refused:
        push(connect(f"http://127.0.0.1:{port}", TOKEN, timeout_s=2), influx=None)
    # one line in the words of the operating system, not the HTTP library's nested exception
    assert str(refused.value) == (
        "Grafana did not answer (connection refused): check that it runs and that --url (GRAFANA_URL) points at it"
    )
    with pytest.raises(IotwatchError, match=r"Grafana did not answer \(cannot resolve no-such-host.invalid\)"):
        push(connect("http://no-such-host.invalid:3000", TOKEN, timeout_s=2), influx=None)
