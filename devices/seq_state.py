"""Where each simulated device's ``seq`` and event time carry on from, run after run
(docs/operate/simulators.md, "Running it again"): a JSON file per MQTT broker::

    {"version": 1, "devices": {"home-00000-thermostat-0": [2431, 1763784243100], ...}}

mapping each device to the next seq it publishes and its last event time (ms).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from iotwatch.errors import UserError

__all__ = ["DeviceSeq", "default_path", "load", "save"]

VERSION = 1
#: device id -> (next seq, last event time in ms)
DeviceSeq = dict[str, tuple[int, int]]


def default_path(mqtt_url: str) -> Path:
    """The state file for the devices publishing to this broker."""
    parts = urlsplit(mqtt_url)
    name = f"{parts.hostname or 'localhost'}-{parts.port or 1883}".replace(":", "_")
    return Path.home() / ".iotwatch" / "simulate" / f"seq-{name}.json"


def load(path: Path) -> DeviceSeq:
    """The devices in the file (none when it does not exist yet); a damaged file is an error
    that names it (continuing from 0 instead would be silent)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UserError(f"seq state file {path} cannot be read ({exc}); delete it or pass --fresh-seq") from exc
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("devices"), dict):
        raise UserError(f"seq state file {path} is not a version {VERSION} state file; delete it or pass --fresh-seq")
    return {device: (int(seq), int(ts)) for device, (seq, ts) in data["devices"].items()}


def save(path: Path, devices: Mapping[str, tuple[int, int]]) -> None:
    """Merge ``devices`` into the file (other devices kept), atomically."""
    merged = {**load(path), **devices}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": VERSION, "devices": {d: list(v) for d, v in sorted(merged.items())}}))
    os.replace(tmp, path)
