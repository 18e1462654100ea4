"""Helpers for the device simulator tests."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from iotwatch.devices.config import SimConfig
from iotwatch.devices.simulation import STATUS, Simulation

START_MS = 1_763_784_000_000  # 2025-11-22 04:00 UTC


def generate(config: SimConfig, duration_s: float, shard: int = 0, shards: int = 1) -> list[tuple[int, str, Any, int]]:
    sim = Simulation(config, shard, shards)
    return [m for batch in sim.run(duration_s) for m in batch]


def telemetry_by_device(messages: list[tuple[int, str, Any, int]]) -> dict[str, list[dict[str, Any]]]:
    """Valid JSON telemetry grouped by device id, in publish order."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _, _, payload, group in messages:
        if group == STATUS:
            continue
        try:
            message = json.loads(payload)
        except ValueError:
            continue
        if isinstance(message, dict) and "device_id" in message:
            out[message["device_id"]].append(message)
    return out
