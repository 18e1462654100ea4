"""A stand-in for Grafana's HTTP API: NOT Grafana, a tiny local server for the push tests.

No Grafana can run here (it is in neither Debian, PyPI nor npm), so this ``http.server``
answers the few endpoints ``iotwatch dashboards push`` uses, the way Grafana's HTTP API
documentation describes them (status codes, the fields grafana-client reads), keeps what
was uploaded, and records every call. It checks what Grafana would refuse in those calls:
missing or wrong credentials (401), a folder or datasource that already exists (409), a
dashboard uid that exists without ``overwrite`` (412), an unknown folder uid (400). It does
not validate dashboard JSON the way Grafana's schema migration does.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Call:
    method: str
    path: str
    body: Any
    authorization: str | None


@dataclass
class GrafanaState:
    token: str
    folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    datasources: dict[str, dict[str, Any]] = field(default_factory=dict)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    next_id: int = 1

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id


class FakeGrafana:
    def __init__(self, token: str = "glsa_test_token") -> None:
        self.state = GrafanaState(token)
        state, lock = self.state, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                path = self.path.split("?")[0]
                with lock:
                    state.calls.append(Call(self.command, path, body, self.headers.get("Authorization")))
                    if self.headers.get("Authorization") != f"Bearer {state.token}":
                        return self._send(401, {"message": "Unauthorized"})
                    status, answer = route(state, self.command, path, body)
                self._send(status, answer)

            def _send(self, status: int, answer: Any) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeGrafana:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def calls(self, method: str | None = None, prefix: str = "") -> list[Call]:
        return [c for c in self.state.calls if (method is None or c.method == method) and c.path.startswith(prefix)]


def route(state: GrafanaState, method: str, path: str, body: Any) -> tuple[int, Any]:
    parts = path.strip("/").split("/")  # ["api", ...]
    if parts[:2] == ["api", "folders"]:
        if method == "GET" and len(parts) == 2:
            return 200, [{"id": f["id"], "uid": f["uid"], "title": f["title"]} for f in state.folders.values()]
        if method == "GET" and len(parts) == 3:
            folder = state.folders.get(parts[2])
            return (200, folder) if folder else (404, {"message": "folder not found", "status": "not-found"})
        if method == "POST" and len(parts) == 2:
            uid = body.get("uid") or f"f{state.new_id()}"
            if uid in state.folders or any(f["title"] == body["title"] for f in state.folders.values()):
                return 409, {"message": "a folder with the same name already exists"}
            state.folders[uid] = {
                "id": state.new_id(),
                "uid": uid,
                "title": body["title"],
                "url": f"/dashboards/f/{uid}/",
            }
            return 200, state.folders[uid]
    if parts[:2] == ["api", "datasources"]:
        if method == "GET" and parts[2:3] == ["uid"]:
            ds = state.datasources.get(parts[3])
            return (200, ds) if ds else (404, {"message": "Data source not found"})
        if method == "POST" and len(parts) == 2:
            if body.get("uid") in state.datasources or any(
                d["name"] == body["name"] for d in state.datasources.values()
            ):
                return 409, {"message": "data source with the same name already exists"}
            ds = {**body, "id": state.new_id(), "version": 1}
            ds.pop("secureJsonData", None)
            state.datasources[ds["uid"]] = ds
            return 200, {"datasource": ds, "id": ds["id"], "message": "Datasource added", "name": ds["name"]}
        if method == "PUT" and parts[2:3] == ["uid"]:
            old = state.datasources.get(parts[3])
            if old is None:
                return 404, {"message": "Data source not found"}
            ds = {**body, "id": old["id"], "uid": parts[3], "version": old["version"] + 1}
            ds.pop("secureJsonData", None)
            state.datasources[parts[3]] = ds
            return 200, {"datasource": ds, "id": ds["id"], "message": "Datasource updated", "name": ds["name"]}
    if parts[:3] == ["api", "dashboards", "db"] and method == "POST":
        dashboard, folder = body["dashboard"], body.get("folderUid")
        if folder and folder not in state.folders:
            return 400, {"message": "folder not found"}
        uid = dashboard["uid"]
        old = state.dashboards.get(uid)
        if old and not body.get("overwrite"):
            return 412, {"message": "A dashboard with the same uid already exists", "status": "name-exists"}
        version = old["version"] + 1 if old else 1
        state.dashboards[uid] = {
            "dashboard": dashboard,
            "folderUid": folder,
            "version": version,
            "id": old["id"] if old else state.new_id(),
            "message": body.get("message"),
        }
        return 200, {
            "id": state.dashboards[uid]["id"],
            "uid": uid,
            "status": "success",
            "version": version,
            "slug": uid,
            "url": f"/d/{uid}/{uid}",
        }
    return 404, {"message": "Not found"}
