"""``iotwatch dashboards build|push``: write the dashboard JSON, or upload it to Grafana."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from iotwatch.cli import AppContext, emit, json_option, pass_app
from iotwatch.dashboards import JSON_DIR, write_all
from iotwatch.dashboards.builder import FOLDER
from iotwatch.errors import IotwatchError


@click.group()
def dashboards() -> None:
    """Grafana dashboards as code: build the JSON, push it to a Grafana."""


@dashboards.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=JSON_DIR,
    show_default=True,
    help="Directory for the JSON files (the default is what docker-compose provisions).",
)
@json_option
def build(out_dir: Path, as_json: bool) -> None:
    """Write every dashboard's JSON model into --out."""
    paths = write_all(out_dir)
    emit(
        {"out": str(out_dir), "files": [p.name for p in paths]},
        as_json,
        lambda r: click.echo("\n".join(f"wrote {out_dir / name}" for name in r["files"])),
    )


@dashboards.command()
@click.option(
    "--url",
    required=True,
    envvar="GRAFANA_URL",
    metavar="http://HOST:3000",
    help="Grafana base URL (also GRAFANA_URL).",
)
@click.option(
    "--token",
    envvar="GRAFANA_TOKEN",
    metavar="TOKEN",
    help="Service-account token, or USER:PASSWORD (also GRAFANA_TOKEN; prefer the variable, "
    "command lines are visible to other users).",
)
@click.option("--folder", default=FOLDER, show_default=True, help="Folder the dashboards go into (created if missing).")
@click.option(
    "--influx-url",
    metavar="http://HOST:8086",
    help="InfluxDB URL as Grafana reaches it, for the datasource (default: the iotwatch InfluxDB setting).",
)
@click.option("--database", help="InfluxDB (1.x/DBRP) database name (default: the iotwatch setting).")
@click.option("--no-datasource", is_flag=True, help="Upload dashboards only; leave the datasource alone.")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds per Grafana request.")
@json_option
@pass_app
def push(
    app: AppContext,
    url: str,
    token: str | None,
    folder: str,
    influx_url: str | None,
    database: str | None,
    no_datasource: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Upload the datasource (uid iotwatch-influxdb) and every dashboard to a running Grafana.

    Idempotent: same uids, overwrite. The InfluxDB token/credentials for the datasource come
    from the iotwatch InfluxDB settings (IOTWATCH_INFLUX_TOKEN, or USERNAME/PASSWORD).
    """
    from iotwatch.dashboards.push import connect
    from iotwatch.dashboards.push import push as do_push

    influx = None
    if not no_datasource:
        settings = app.settings.influx
        influx = settings.model_copy(
            update={
                "url": settings.url if influx_url is None else influx_url,
                "database": database or settings.database,
            }
        )
        if not influx.url:
            raise IotwatchError("no InfluxDB URL for the datasource: give --influx-url or --no-datasource")
    result = do_push(connect(url, token, timeout), folder=folder, influx=influx)

    def render(r: dict[str, Any]) -> None:
        click.echo(f"folder {r['folder'].get('title')} (uid {r['folder'].get('uid')})")
        if r["datasource"]:
            click.echo(f"datasource iotwatch-influxdb {r['datasource']['action']}")
        for d in r["dashboards"]:
            click.echo(f"dashboard {d['uid']}: {d['status']} version {d['version']} {d['url'] or ''}")

    emit(asdict(result), as_json, render)
