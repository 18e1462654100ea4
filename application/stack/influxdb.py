"""InfluxDB 1.x (Debian's ``influxd``), configured to keep everything under the run dir."""

from __future__ import annotations

import shutil
from pathlib import Path

from iotwatch.application.stack.process import free_port, start_process, wait_until
from iotwatch.application.stack.service import RunningService
from iotwatch.clients.influx import InfluxV1Client
from iotwatch.errors import StackError
from iotwatch.settings import InfluxSettings

HOST = "127.0.0.1"

#: Cached points written to disk at this size; small, because the metrics arrive steadily
#: and a snapshot is a cheap write, so the server's memory stays flat. The cache grows about
#: 140 KB a minute under a 2,000 msg/s chaos load (``tsm1_cache`` ``memBytes`` in /debug/vars):
#: 256 KB is written within two minutes, 2 MB only after a quarter of an hour, the server's
#: heap climbing with it meanwhile (docs/operate/chaos.md, *Resources*).
CACHE_SNAPSHOT = "256k"

#: Garbage the Go collector lets build up, in percent of the live heap (GOGC; 100 by default).
#: The server's live heap is about 5 MB and each write leaves garbage: at 100 its anonymous
#: memory swings between 12 and 19 MB with the collections, at 25 it stays at 8-9 MB (a
#: snapshot's buffers add ~5 MB for a few seconds), for ~0.6% of a core instead of ~0.3%.
GOGC = "25"


def influxd_binary() -> str | None:
    return shutil.which("influxd") or (str(Path("/usr/bin/influxd")) if Path("/usr/bin/influxd").exists() else None)


def start_influxdb(run_dir: Path, database: str, timeout_s: float, port: int | None = None) -> RunningService:
    """Start influxd on free ports (HTTP and its RPC bind; ``port``: a fixed HTTP port, to
    start it again where its clients expect it), wait for /ping, create the database."""
    binary = influxd_binary()
    if not binary:
        raise StackError(
            "influxd is not installed: apt-get install -y influxdb "
            "(or set IOTWATCH_STACK_INFLUXDB=none to run without metrics)"
        )
    base = run_dir / "influxdb"
    for sub in ("meta", "data", "wal"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    http_port, rpc_port = port or free_port(HOST), free_port(HOST)
    conf = base / "influxdb.conf"
    conf.write_text(
        "reporting-disabled = true\n"
        f'bind-address = "{HOST}:{rpc_port}"\n'
        f'[meta]\n  dir = "{base}/meta"\n'
        f'[data]\n  dir = "{base}/data"\n  wal-dir = "{base}/wal"\n  query-log-enabled = false\n'
        # Points wait in memory until a snapshot writes them to a TSM file: at 25 MB (the
        # default) the embedded server's memory climbs for many minutes between snapshots.
        f'  cache-snapshot-memory-size = "{CACHE_SNAPSHOT}"\n  cache-snapshot-write-cold-duration = "1m"\n'
        f'[http]\n  enabled = true\n  bind-address = "{HOST}:{http_port}"\n  log-enabled = false\n'
        "[monitor]\n  store-enabled = false\n"
        "[continuous_queries]\n  log-enabled = false\n"
    )
    # GOGC in the command, so that a restart of the same command keeps it
    record = start_process("influx", ["env", f"GOGC={GOGC}", binary, "-config", str(conf)], base / "influxd.log")
    endpoint = f"http://{HOST}:{http_port}"
    client = InfluxV1Client(InfluxSettings(url=endpoint, database=database))
    # ping raises until the server answers
    wait_until(client.ping, timeout_s=timeout_s, what=f"InfluxDB on port {http_port}", record=record)
    version = client.ping()
    client.create_database()
    client.close()
    return RunningService("influx", f"influxd {version}", endpoint, record)
