"""Per device type and metric: unit normalisation, derived metrics and physical range checks.

Readings are flagged, never silently dropped: a value outside its physical range keeps
its value, is listed in its reading's ``out_of_range`` metrics, is archived as such, feeds the
``out_of_range`` rule and is kept away from the statistical detectors (one impossible
value must not poison a device's baseline).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from iotwatch.contract.metric_catalog import DEVICE_METRICS, NOT_SCORED, UNIT_ALIASES

#: Below this apparent power (V x A) a meter's power factor is mostly rounding noise.
MIN_APPARENT_VA = 20.0


def physical_range(device_type: str, metric: str) -> tuple[float, float] | None:
    known = DEVICE_METRICS.get(device_type, {})
    if metric not in known:
        return None
    _, low, high = known[metric]
    return low, high


def entry_column(n: int, entry_reading: np.ndarray, names: np.ndarray, values: np.ndarray, metric: str) -> np.ndarray:
    """One metric's entry values (a value, a score) as a column over ``n`` readings: NaN
    where a reading lacks the metric."""
    column = np.full(n, np.nan)
    hits = names == metric
    column[entry_reading[hits]] = values[hits]
    return column


class CleanEntries(NamedTuple):
    """Cleaned entries, sorted by record, then metric name (one reading's metrics in a stable
    order); ``names[name_codes[k]]`` is ``name[k]``, for callers that group by metric."""

    record: np.ndarray
    name: np.ndarray
    value: np.ndarray
    out_of_range: np.ndarray
    name_codes: np.ndarray
    names: np.ndarray  # the distinct metric names


def clean_entries(record: np.ndarray, name: np.ndarray, value: np.ndarray, device_type: np.ndarray) -> CleanEntries:
    """A micro-batch's metrics cleaned: entry ``k`` is metric ``name[k] = value[k]`` of record
    ``record[k]``, whose device type is ``device_type[record[k]]``. Unit aliases become their
    canonical metric (the canonical one wins if a reading has both); a smart meter gets the
    derived ``power_factor`` (below); an entry outside its device type's physical range, where
    the catalogue knows the metric, is flagged ``out_of_range``.

    A smart meter's real power, voltage and current come from one metering chip, so
    ``power_factor = P / (V * I)`` is nearly constant for a device. A fault in one of the
    three (a stuck or spiking power register) breaks it at once, even when the faulty value
    alone looks like an appliance switching on; the per-metric detectors score the derived
    metric like any other. A reported ``power_factor`` is kept as it is.

    The names are factorised once and compared as codes: a batch has a few distinct metric
    names among hundreds of thousands of entries."""
    record, name, value = _normalise_entries(record, name, value)
    record, name, value = _derive_power_factor(record, name, value, device_type)
    codes, names = pd.factorize(name)
    if len(record):
        name_rank = np.argsort(np.argsort(np.asarray(names, dtype=str)))
        order = np.lexsort((name_rank[codes], record))
    else:
        order = np.zeros(0, dtype=np.int64)
    record, name, value, codes = record[order], name[order], value[order], codes[order]
    return CleanEntries(record, name, value, _out_of_range(codes, names, value, device_type[record]), codes, names)


def _normalise_entries(
    record: np.ndarray, name: np.ndarray, value: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    aliases = [alias for alias in pd.unique(name).tolist() if alias in UNIT_ALIASES]
    if not aliases:
        return record, name, value
    keep = np.ones(len(name), dtype=bool)
    value = value.copy()
    name = name.copy()
    for alias in aliases:
        canonical, convert = UNIT_ALIASES[alias]
        hits = np.flatnonzero(name == alias)
        already = set(record[name == canonical].tolist())  # the canonical one wins
        for k in hits.tolist():
            if record[k] in already:
                keep[k] = False
            else:
                value[k] = convert(value[k])
                name[k] = canonical
                already.add(record[k])
    return record[keep], name[keep], value[keep]


def _derive_power_factor(
    record: np.ndarray, name: np.ndarray, value: np.ndarray, device_type: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    meters = device_type[record] == "smart_meter"
    if not meters.any():
        return record, name, value
    series = {
        m: pd.Series(value[meters & (name == m)], index=record[meters & (name == m)])
        for m in ("power_w", "voltage_v", "current_a", "power_factor")
    }
    frame = pd.DataFrame({m: s[~s.index.duplicated()] for m, s in series.items()})
    frame = frame[frame["power_factor"].isna()].dropna(subset=["power_w", "voltage_v", "current_a"])
    apparent = frame["voltage_v"] * frame["current_a"]
    frame = frame[apparent >= MIN_APPARENT_VA]
    if frame.empty:
        return record, name, value
    factor = np.round(frame["power_w"].to_numpy() / (frame["voltage_v"] * frame["current_a"]).to_numpy(), 4)
    return (
        np.concatenate([record, frame.index.to_numpy(dtype=record.dtype)]),
        np.concatenate([name, np.full(len(frame), "power_factor", dtype=object)]),
        np.concatenate([value, factor]),
    )


def _out_of_range(name_codes: np.ndarray, names: np.ndarray, value: np.ndarray, device_type: np.ndarray) -> np.ndarray:
    """Entries outside their device type's physical range (``names[name_codes[k]]`` is entry
    ``k``'s metric)."""
    low = np.full(len(name_codes), -np.inf)
    high = np.full(len(name_codes), np.inf)
    if len(name_codes):
        type_codes, types = pd.factorize(device_type)
        codes, pairs = pd.factorize(type_codes.astype(np.int64) * len(names) + name_codes)
        bounds = np.array(
            [
                physical_range(types[p // len(names)], names[p % len(names)]) or (-np.inf, np.inf)
                for p in pairs.tolist()
            ],
            dtype=float,
        ).reshape(-1, 2)
        low, high = bounds[codes, 0], bounds[codes, 1]
    return ~((low <= value) & (value <= high))


def scored_names(names: np.ndarray) -> np.ndarray:
    """Which metric names the statistical detectors see (see :data:`NOT_SCORED`)."""
    return ~pd.Series(names, dtype=object).isin(NOT_SCORED).to_numpy()  # a hash lookup, not numpy's sort
