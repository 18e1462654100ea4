"""Ground truth: one JSON line per injected anomaly or transport fault.

Fields: ``device_id``, ``device_type``, ``site``, ``kind``, ``category`` (anomaly or
transport), ``start_ts``/``end_ts`` (event time, ms, of the first and last affected
reading), ``start_seq``/``end_seq`` (inclusive), ``messages`` (readings affected),
``source`` (rate or scenario), ``params``, and ``ended_by_command`` (the command id) when a
device's command ended it (``simulate --obey-commands``). Lines are sorted (start_ts, device_id,
kind), so equal runs write byte-identical files.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["read_ground_truth", "sort_records", "write_ground_truth"]


def sort_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(records, key=lambda r: (r["start_ts"], r["device_id"], r["kind"], r["start_seq"]))


def write_ground_truth(path: Path, records: Iterable[dict[str, Any]]) -> int:
    """Write sorted records as JSONL (atomically); returns the count."""
    rows = sort_records(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as handle:
        for record in rows:
            handle.write(json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n")
    tmp.replace(path)
    return len(rows)


def read_ground_truth(path: Path) -> list[dict[str, Any]]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]
