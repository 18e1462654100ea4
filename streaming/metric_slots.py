"""Each device's metrics in its state table: the row of a (device, metric) pair, added the
first time the device reports the metric, and the metric's newest in-range value."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from iotwatch.streaming.cleaning import scored_names
from iotwatch.streaming.device_table import DeviceTable

#: ``(table, detector rows, banks, devices, metric names)`` of newly added pairs.
Declare = Callable[[DeviceTable, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]


def assign_slots(
    table: DeviceTable,
    pair_device: np.ndarray,
    pair_name: np.ndarray,
    pair_bank: np.ndarray,
    initials: Sequence[np.ndarray],
    declare: Declare | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each (device, metric) pair (distinct): its row in the table's metrics, added
    when new (its detector state a fresh row of ``initials[pair_bank]``); its slot (rank
    among its device's metrics); its detector row (-1 for metrics the detectors do not
    see) and the bank that row is in. ``declare`` puts declared ranges into new pairs' rows."""
    rows = _metric_rows(table, pair_device, pair_name)
    new = np.flatnonzero(rows < 0)
    if len(new):
        watched = scored_names(pair_name[new])
        known = len(table.metric_device)
        moved = table.add_metrics(pair_device[new], pair_name[new], watched, pair_bank[new], initials)
        found = rows >= 0
        rows[found] = moved[rows[found]]
        rows[new] = moved[known:]
        if declare is not None:
            added = rows[new]
            declare(table, table.metric_detector[added], table.metric_bank[added], pair_device[new], pair_name[new])
    if not len(rows):
        return rows, rows, rows, rows
    slots = rows - table.metric_bounds()[pair_device]
    return rows, slots, table.metric_detector[rows], table.metric_bank[rows]


def _metric_rows(table: DeviceTable, pair_device: np.ndarray, pair_name: np.ndarray) -> np.ndarray:
    if not len(table.metric_device) or not len(pair_device):
        return np.full(len(pair_device), -1, dtype=np.int64)
    codes, names = pd.factorize(np.concatenate([table.metric_name, pair_name.astype(object)]))
    width = max(len(names), 1)
    known = table.metric_device * width + codes[: len(table.metric_name)]
    wanted = pair_device.astype(np.int64) * width + codes[len(table.metric_name) :]
    return pd.Index(known).get_indexer(pd.Index(wanted)).astype(np.int64)


def remember_last(
    table: DeviceTable, pair_row: np.ndarray, pair_codes: np.ndarray, values: np.ndarray, ok: np.ndarray
) -> None:
    """Each metric's newest in-range value (the fleet model's previous reading)."""
    positions = np.flatnonzero(ok)
    if not len(positions):
        return
    newest = np.full(len(pair_row), -1, dtype=np.int64)
    np.maximum.at(newest, pair_codes[positions], positions)
    hit = newest >= 0
    table.metric_last[pair_row[hit]] = values[newest[hit]]
