"""Generated streams: a clean seasonal signal, and the same signal with one anomaly kind."""

from __future__ import annotations

import math

import numpy as np

T0 = 1_700_000_000_000
STEP_MS = 300_000  # 5 minutes: 288 readings a day
N = 4000
ONSET = 3000


def clean(seed: int = 0, n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """(t_ms, values): daily sine plus Gaussian noise."""
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    values = 20.0 + 3.0 * np.sin(2 * math.pi * i / 288) + rng.normal(0.0, 0.3, n)
    return T0 + i * STEP_MS, values


def with_anomaly(kind: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """(t_ms, values, onset row) with one anomaly of ``kind`` starting at ``ONSET``."""
    t, v = clean(seed)
    v = v.copy()
    rng = np.random.default_rng(seed + 100)
    if kind == "spike":
        v[ONSET] += 15.0
    elif kind == "level_shift":
        v[ONSET:] += 6.0
    elif kind == "drift":
        v[ONSET:] += np.linspace(0.0, 12.0, len(v) - ONSET)
    elif kind == "flatline":
        v[ONSET : ONSET + 60] = v[ONSET]
    elif kind == "noise_burst":
        v[ONSET : ONSET + 30] += rng.normal(0.0, 4.0, 30)
    elif kind == "out_of_range":
        v[ONSET] = 150.0
    elif kind == "crash":
        v[ONSET] = -9.0
    elif kind == "dropout":
        t = np.concatenate([t[:ONSET], t[ONSET:] + 40 * STEP_MS])
    else:
        raise ValueError(kind)
    return t, v, ONSET
