"""Upload the datasource and dashboards to a running Grafana through its HTTP API (grafana-client).

Idempotent: the folder is looked up (by uid, then by title) and created only when missing,
the datasource is created or updated by its uid, and dashboards are saved by uid with
``overwrite=True``, so running it again replaces what it wrote before.

Dashboards pushed here must not also be file-provisioned in the same Grafana (docker-compose
provisions them from dashboards/json/): Grafana refuses API saves of provisioned dashboards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import niquests
from grafana_client import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException

from iotwatch.dashboards import build_all
from iotwatch.dashboards.builder import DATASOURCE_UID, FOLDER
from iotwatch.errors import IotwatchError, ServiceUnavailable, connection_failure
from iotwatch.settings import InfluxSettings

DATASOURCE_NAME = "iotwatch InfluxDB"


@dataclass
class PushResult:
    folder: dict[str, Any] = field(default_factory=dict)
    datasource: dict[str, Any] | None = None
    dashboards: list[dict[str, Any]] = field(default_factory=list)


def folder_uid(name: str) -> str:
    """A stable folder uid derived from its name (Grafana allows 40 characters)."""
    return (re.sub(r"[^a-zA-Z0-9_-]+", "-", name).strip("-").lower() or "iotwatch")[:40]


def datasource_model(influx: InfluxSettings) -> dict[str, Any]:
    """The same datasource docker-compose provisions (deploy/grafana/provisioning/datasources),
    with ``influx``'s URL as Grafana (not this machine) reaches it, and its credentials."""
    model: dict[str, Any] = {
        "name": DATASOURCE_NAME,
        "uid": DATASOURCE_UID,
        "type": "influxdb",
        "access": "proxy",
        "url": influx.url,
        "database": influx.database,
        "isDefault": False,
        "jsonData": {"version": "InfluxQL", "dbName": influx.database, "httpMode": "GET", "timeInterval": "10s"},
    }
    secure: dict[str, str] = {}
    if influx.token:
        model["jsonData"]["httpHeaderName1"] = "Authorization"
        secure["httpHeaderValue1"] = f"Token {influx.token.get_secret_value()}"
    elif influx.username:
        model["user"] = influx.username
        secure["password"] = influx.password.get_secret_value() if influx.password else ""
    if secure:
        model["secureJsonData"] = secure
    return model


def connect(url: str, token: str | None, timeout_s: float = 10.0) -> GrafanaApi:
    """``token`` is a service-account token, or ``user:password`` for basic authentication."""
    credential: str | tuple[str, str] | None = token
    if token and ":" in token:
        user, _, password = token.partition(":")
        credential = (user, password)
    api: GrafanaApi = GrafanaApi.from_url(url.rstrip("/"), credential=credential, timeout=timeout_s)  # unannotated
    return api


def _ensure_folder(api: GrafanaApi, name: str) -> dict[str, Any]:
    uid = folder_uid(name)
    try:
        return dict(api.folder.get_folder(uid))
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise
    for folder in api.folder.get_all_folders() or []:
        if folder.get("title") == name:
            return dict(folder)
    return dict(api.folder.create_folder(name, uid=uid))


def _upsert_datasource(api: GrafanaApi, model: dict[str, Any]) -> dict[str, Any]:
    try:
        existing = api.datasource.get_datasource_by_uid(DATASOURCE_UID)
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise
        existing = None
    if existing is None:
        return {"action": "created", **dict(api.datasource.create_datasource(model) or {})}
    return {"action": "updated", **dict(api.datasource.update_datasource_by_uid(DATASOURCE_UID, model) or {})}


def push(api: GrafanaApi, folder: str = FOLDER, influx: InfluxSettings | None = None) -> PushResult:
    """Folder, then datasource (when ``influx`` is given), then every dashboard."""
    result = PushResult()
    try:
        result.folder = _ensure_folder(api, folder)
        if influx is not None:
            result.datasource = _upsert_datasource(api, datasource_model(influx))
        for file_name, model in build_all().items():
            body = {
                "dashboard": {**model, "id": None},
                "folderUid": result.folder.get("uid", folder_uid(folder)),
                "overwrite": True,
                "message": "iotwatch dashboards push",
            }
            answer = api.dashboard.update_dashboard(body) or {}
            result.dashboards.append(
                {
                    "file": file_name,
                    "uid": model["uid"],
                    "title": model["title"],
                    "status": answer.get("status"),
                    "url": answer.get("url"),
                    "version": answer.get("version"),
                }
            )
    except GrafanaException as exc:
        raise IotwatchError(f"Grafana refused the request: {exc.message}") from exc
    except niquests.exceptions.RequestException as exc:
        raise ServiceUnavailable(
            f"Grafana did not answer ({connection_failure(exc)}): check that it runs and that --url (GRAFANA_URL) "
            "points at it"
        ) from exc
    return result
