"""Counter-based random numbers: a draw is a pure function of (seed, device, seq, stream)
(docs/internals.md, "Random numbers")."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["CounterRng", "normal_from"]

Words = npt.NDArray[np.uint64]
Floats = npt.NDArray[np.float64]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SEQ_MUL = np.uint64(0xD6E8FEB86659FD93)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_INV53 = 1.0 / (1 << 53)


def _mix(x: Words) -> Words:
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


class CounterRng:
    """Uniform and normal draws keyed by (device uid, seq, stream)."""

    def __init__(self, seed: int) -> None:
        self.key = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) + _GOLDEN)[0]

    def bits(self, uid: np.ndarray, seq: np.ndarray, stream: int, k: int = 1) -> Words:
        """(n, k) uint64 draws for streams ``stream .. stream+k-1``."""
        base = _mix(uid.astype(np.uint64) * _GOLDEN + self.key) ^ (seq.astype(np.uint64) * _SEQ_MUL)
        streams = (np.arange(stream, stream + k, dtype=np.uint64) + np.uint64(1)) * _GOLDEN
        return _mix(_mix(base[:, None] + streams[None, :]))

    def uniform(self, uid: np.ndarray, seq: np.ndarray, stream: int, k: int = 1) -> Floats:
        """(n, k) floats in [0, 1)."""
        return (self.bits(uid, seq, stream, k) >> _S11).astype(np.float64) * _INV53

    def normal(self, uid: np.ndarray, seq: np.ndarray, stream: int, k: int = 1) -> Floats:
        """(n, k) standard normal draws (Box-Muller over 2k uniforms)."""
        u = self.uniform(uid, seq, stream, 2 * k)
        radius = np.sqrt(-2.0 * np.log1p(-u[:, :k]))  # 1-u in (0, 1]: no log(0)
        return radius * np.cos(2.0 * np.pi * u[:, k:])

    def scalar_uniform(self, uid: int, seq: int, stream: int) -> float:
        """One uniform draw (device set-up, scenario selection)."""
        return float(self.uniform(np.array([uid], dtype=np.uint64), np.array([seq], dtype=np.int64), stream)[0, 0])


def normal_from(u: Floats) -> Floats:
    """Standard normal draws from an (n, 2k) block of uniforms (Box-Muller) -> (n, k)."""
    k = u.shape[1] // 2
    return np.sqrt(-2.0 * np.log1p(-u[:, :k])) * np.cos(2.0 * np.pi * u[:, k : 2 * k])
