"""Surprises that physics explains: metrics of one device that must move together (a smart
meter's power and current, witnessed by the power factor) raise no anomaly alert when they
move together (docs/streaming-internals.md, "Couplings").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iotwatch.streaming.cleaning import entry_column

__all__ = ["COUPLINGS", "Coupling", "explained_entries"]


@dataclass(frozen=True)
class Coupling:
    """Metrics of ``device_type`` that a physical cause moves together, and the derived
    metric that holds steady when they move for that cause."""

    device_type: str
    moving: tuple[str, ...]
    witness: str


#: A meter's load: power and current switch together, the power factor holds.
COUPLINGS: tuple[Coupling, ...] = (Coupling("smart_meter", ("power_w", "current_a"), "power_factor"),)


def explained_entries(
    reading_type: np.ndarray,
    entry_reading: np.ndarray,
    names: np.ndarray,
    surprises: np.ndarray,
    *,
    moved: float | np.ndarray,
    broken: float | np.ndarray,
    couplings: tuple[Coupling, ...] = COUPLINGS,
) -> np.ndarray:
    """Which metric entries' scores a coupling explains (boolean, one per entry).

    ``reading_type`` is each reading's device type, ``entry_reading`` each entry's reading
    (entries of a reading are contiguous), ``names``/``surprises`` each entry's metric and
    detector surprise (NaN: not scored). A moving metric moved when its surprise is at
    least ``moved``; the witness broke when its surprise is at least ``broken`` (each a
    level, or one per reading: its detector's)."""
    explained = np.zeros(len(names), dtype=bool)
    if not len(names):
        return explained
    n = len(reading_type)
    for coupling in couplings:
        of_type = reading_type == coupling.device_type
        if not of_type.any():
            continue
        mine = np.flatnonzero(of_type[entry_reading])  # only this type's entries are compared by name
        reading, name, surprise = entry_reading[mine], names[mine], surprises[mine]
        together = entry_column(n, reading, name, surprise, coupling.witness) < broken  # NaN: no witness -> False
        for metric in coupling.moving:
            together &= entry_column(n, reading, name, surprise, metric) >= moved
        if together.any():
            explained[mine] |= together[reading] & np.isin(name, coupling.moving)
    return explained
