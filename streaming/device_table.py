"""Many devices' state as columns: what a micro-batch loads, updates and saves with numpy
calls, and its one LZ4-compressed binary value in the state store
(docs/streaming-internals.md, "Device state").
"""

from __future__ import annotations

import builtins
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from iotwatch.streaming.device_state import (
    BUCKET_FIELDS,
    CORE_FIELDS,
    COUNTERS,
    EPISODE_FIELDS,
    MAX_EVENT_MS,
    SEQ_HIGH,
)

#: First bytes of a serialised table, and of a compressed one.
MAGIC = b"IWT2"
COMPRESSED = b"IWZ1"
_RAW_LENGTH = struct.Struct("<Q")
_SEP = "\x1f"
#: After MAGIC: devices, metrics, episodes, buckets, seq words, banks, and the byte lengths
#: of the five string parts; then each bank's rows and row size.
_HEADER = struct.Struct("<6I5I")
_BANK = struct.Struct("<2I")
#: After the strings, the numeric columns: (field, stored dtype, rows of), the detector banks'
#: rows before ``episode_device``. Index columns are int64 in memory, narrower in the value.
_COLUMNS = (
    ("core", "<i8", "device"),
    ("seqs", "<u8", "device"),
    ("metric_device", "<i4", "metric"),
    ("metric_last", "<f8", "metric"),
    ("metric_detector", "<i4", "metric"),
    ("metric_bank", "i1", "metric"),
    ("episode_device", "<i4", "episode"),
    ("episodes", "<i8", "episode"),
    ("peaks", "<f8", "episode"),
    ("bucket_device", "<i4", "bucket"),
    ("buckets", "<f8", "bucket"),
)
_BANKS_AT = 6
_IN_MEMORY = dict.fromkeys(
    ("metric_device", "metric_detector", "metric_bank", "episode_device", "bucket_device"), "<i8"
)
_WIDTHS = {"core": len(CORE_FIELDS), "episodes": len(EPISODE_FIELDS), "buckets": len(BUCKET_FIELDS)}


def _strings(values: Sequence[str] | np.ndarray) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def _encode_strings(values: np.ndarray) -> tuple[bytes, bytes]:
    """A vocabulary (joined) and int32 codes: few distinct types, sites and metric names.
    (Dicts built and looked up in C: no Python step per entry, and no pandas set-up, which
    costs more than the work at a shard of tens of devices.)"""
    if not len(values):
        return b"", b""
    entries = values.tolist()
    vocabulary = dict.fromkeys(entries)
    code = {word: k for k, word in enumerate(vocabulary)}
    codes = np.fromiter(map(code.__getitem__, entries), dtype=np.int32, count=len(entries))
    return _SEP.join(vocabulary).encode(), codes.tobytes()


def _decode_strings(vocabulary: bytes, codes: np.ndarray) -> np.ndarray:
    if not len(codes):
        return _strings([])
    return _strings(vocabulary.decode().split(_SEP)).take(codes)  # ("" splits into [""]: one empty word)


@dataclass
class DeviceTable:
    """The state of ``len(ids)`` devices, see the module's docstring."""

    ids: np.ndarray
    device_type: np.ndarray
    site: np.ndarray
    core: np.ndarray
    seqs: np.ndarray
    metric_device: np.ndarray
    metric_name: np.ndarray
    metric_last: np.ndarray
    metric_detector: np.ndarray
    metric_bank: np.ndarray
    detectors: list[np.ndarray]
    episode_device: np.ndarray
    episodes: np.ndarray
    peaks: np.ndarray
    bucket_device: np.ndarray
    buckets: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def empty(cls, ids: Sequence[str] | np.ndarray, seq_words: int, state_sizes: Sequence[int]) -> DeviceTable:
        """New devices: no type or site yet, nothing seen (seq high-water mark -1);
        ``state_sizes``: the row width of each detector bank."""
        n = len(ids)
        core = np.zeros((n, len(CORE_FIELDS)), dtype=np.int64)
        core[:, SEQ_HIGH] = -1
        core[:, MAX_EVENT_MS] = -1
        none = np.zeros(0, dtype=np.int64)
        return cls(
            _strings(ids),
            _strings([""] * n),
            _strings([""] * n),
            core,
            np.zeros((n, seq_words), dtype=np.uint64),
            none,
            _strings([]),
            np.zeros(0),
            none,
            none,
            [np.zeros((0, size)) for size in state_sizes],
            none,
            np.zeros((0, len(EPISODE_FIELDS)), dtype=np.int64),
            np.zeros(0),
            none,
            np.zeros((0, len(BUCKET_FIELDS))),
        )

    # -- grouped rows ---------------------------------------------------------------------------

    def metric_bounds(self) -> np.ndarray:
        """Device ``d``'s metric rows are ``bounds[d]:bounds[d + 1]`` (slot ``k`` at ``bounds[d] + k``)."""
        return np.searchsorted(self.metric_device, np.arange(len(self) + 1))

    def metric_names(self, d: int) -> list[str]:
        bounds = np.searchsorted(self.metric_device, [d, d + 1])
        return list(self.metric_name[bounds[0] : bounds[1]])

    def add_metrics(
        self,
        device: np.ndarray,
        name: np.ndarray,
        watched: np.ndarray,
        bank: np.ndarray,
        initials: Sequence[np.ndarray],
    ) -> np.ndarray:
        """Append new (device, metric) rows -- after each device's existing ones, in the given
        order -- with a fresh detector row (``initials[bank]``) in its ``bank`` for the
        ``watched`` ones. Rows move: returns where each row went, the existing ones first,
        then the new ones in the given order."""
        detector = np.full(len(device), -1, dtype=np.int64)
        for b, initial in enumerate(initials):
            mine = watched & (bank == b)
            count = int(mine.sum())
            if count:
                detector[mine] = len(self.detectors[b]) + np.arange(count)
                self.detectors[b] = np.ascontiguousarray(np.vstack([self.detectors[b], np.tile(initial, (count, 1))]))
        all_device = np.concatenate([self.metric_device, device.astype(np.int64)])
        order = np.argsort(all_device, kind="stable")
        self.metric_device = all_device[order]
        self.metric_name = np.concatenate([self.metric_name, name.astype(object)])[order]
        self.metric_last = np.concatenate([self.metric_last, np.full(len(device), np.nan)])[order]
        self.metric_detector = np.concatenate([self.metric_detector, detector])[order]
        self.metric_bank = np.concatenate([self.metric_bank, np.where(watched, bank, 0).astype(np.int64)])[order]
        position = np.empty(len(order), dtype=np.int64)
        position[order] = np.arange(len(order))
        return position

    # -- selection and assembly -------------------------------------------------------------------

    def take(self, rows: np.ndarray) -> DeviceTable:
        """The devices ``rows`` (distinct), in that order."""
        rows = np.asarray(rows, dtype=np.int64)

        def grouped(device: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """The rows of each device of ``rows`` in turn (a device's rows are one range)."""
            counts = np.bincount(device, minlength=len(self))
            count = counts[rows]
            ends = np.cumsum(count)
            order = np.repeat(np.cumsum(counts)[rows] - ends, count) + np.arange(ends[-1] if len(ends) else 0)
            return order, np.repeat(np.arange(len(rows)), count)

        m, metric_device = grouped(self.metric_device)
        renumbered, detectors = self._pick_detectors(m)
        e, episode_device = grouped(self.episode_device)
        b, bucket_device = grouped(self.bucket_device)
        return DeviceTable(
            self.ids[rows],
            self.device_type[rows],
            self.site[rows],
            self.core[rows],
            self.seqs[rows],
            metric_device,
            self.metric_name[m],
            self.metric_last[m],
            renumbered,
            self.metric_bank[m],
            detectors,
            episode_device,
            self.episodes[e],
            self.peaks[e],
            bucket_device,
            self.buckets[b],
        )

    def slice(self, lo: int, hi: int) -> DeviceTable:
        """The devices ``lo:hi`` (a contiguous range: each grouped column is one range too), in
        views of this table's arrays where they can be."""
        m = slice(*np.searchsorted(self.metric_device, [lo, hi]).tolist())
        e = slice(*np.searchsorted(self.episode_device, [lo, hi]).tolist())
        b = slice(*np.searchsorted(self.bucket_device, [lo, hi]).tolist())
        renumbered, detectors = self._pick_detectors(m)
        return DeviceTable(
            self.ids[lo:hi],
            self.device_type[lo:hi],
            self.site[lo:hi],
            self.core[lo:hi],
            self.seqs[lo:hi],
            self.metric_device[m] - lo,
            self.metric_name[m],
            self.metric_last[m],
            renumbered,
            self.metric_bank[m],
            detectors,
            self.episode_device[e] - lo,
            self.episodes[e],
            self.peaks[e],
            self.bucket_device[b] - lo,
            self.buckets[b],
        )

    def _pick_detectors(self, m: np.ndarray | builtins.slice) -> tuple[np.ndarray, list[np.ndarray]]:
        """The detector rows of the metric rows ``m``, each bank's in metric order, and
        each metric's row in its bank's new array (-1: not watched)."""
        detector, bank = self.metric_detector[m], self.metric_bank[m]
        renumbered = np.full(len(detector), -1, dtype=np.int64)
        picked = []
        for b, rows in enumerate(self.detectors):
            used = (detector >= 0) & (bank == b)
            renumbered[used] = np.arange(int(used.sum()))
            at = detector[used]  # (a slice of rows in order, as after ``take``, is a view)
            ranged = isinstance(m, builtins.slice) and len(at) and (np.diff(at) == 1).all()
            picked.append(rows[at[0] : at[-1] + 1] if ranged else np.ascontiguousarray(rows[at]))
        return renumbered, picked

    @classmethod
    def concat(cls, tables: Sequence[DeviceTable]) -> DeviceTable:
        """The tables' devices one after another (each table's grouping is kept)."""
        first = tables[0]
        if len(tables) == 1:
            return first
        base = np.cumsum([0] + [len(t) for t in tables[:-1]])
        banks = len(first.detectors)
        # where each table's rows start in each bank's joined array: (tables, banks)
        detector_base = np.cumsum([[0] * banks] + [[len(d) for d in t.detectors] for t in tables[:-1]], axis=0)
        cat = np.concatenate
        return cls(
            cat([t.ids for t in tables]),
            cat([t.device_type for t in tables]),
            cat([t.site for t in tables]),
            cat([t.core for t in tables]),
            cat([t.seqs for t in tables]),
            cat([t.metric_device + b for t, b in zip(tables, base, strict=True)]),
            cat([t.metric_name for t in tables]),
            cat([t.metric_last for t in tables]),
            cat(
                [
                    np.where(t.metric_detector >= 0, t.metric_detector + b[t.metric_bank], -1)
                    for t, b in zip(tables, detector_base, strict=True)
                ]
            ),
            cat([t.metric_bank for t in tables]),
            [np.ascontiguousarray(cat([t.detectors[b] for t in tables])) for b in range(banks)],
            cat([t.episode_device + b for t, b in zip(tables, base, strict=True)]),
            cat([t.episodes for t in tables]),
            cat([t.peaks for t in tables]),
            cat([t.bucket_device + b for t, b in zip(tables, base, strict=True)]),
            cat([t.buckets for t in tables]),
        )

    # -- one value in the state store ---------------------------------------------------------------

    def to_bytes(self, compress: bool = True) -> bytes:
        """The table as one binary value: header, then the columns (see the module's docstring)."""
        raw = self._raw_bytes()
        if not compress:
            return raw
        return COMPRESSED + _RAW_LENGTH.pack(len(raw)) + pa.compress(raw, codec="lz4", asbytes=True)

    def _raw_bytes(self) -> bytes:
        names = [
            _SEP.join(self.ids.tolist()).encode(),
            *_encode_strings(self.device_type),
            *_encode_strings(self.site),
            *_encode_strings(self.metric_name),
        ]
        ids, type_vocabulary, type_codes, site_vocabulary, site_codes, name_vocabulary, name_codes = names
        counts = (len(self), len(self.metric_device), len(self.episodes), len(self.buckets), self.seqs.shape[1])
        header = MAGIC + _HEADER.pack(
            *counts, len(self.detectors), len(ids), len(type_vocabulary), len(site_vocabulary), len(name_vocabulary), 0
        )
        columns = [np.ascontiguousarray(getattr(self, name), dtype=stored).data for name, stored, _ in _COLUMNS]
        return b"".join(
            [
                header,
                *(_BANK.pack(*rows.shape) for rows in self.detectors),
                ids,
                type_vocabulary,
                site_vocabulary,
                name_vocabulary,
                type_codes,
                site_codes,
                name_codes,
                *columns[:_BANKS_AT],
                *(np.ascontiguousarray(rows).data for rows in self.detectors),
                *columns[_BANKS_AT:],
            ]
        )

    @classmethod
    def from_bytes(cls, blob: bytes, state_sizes: Sequence[int]) -> DeviceTable:
        """A table of :meth:`to_bytes`, whose detector banks must be ``state_sizes`` wide
        (a table of fewer banks holds the first ones and the others start empty); its arrays
        are read-only views of the value: a table is copied (``take``, ``concat``) before it changes."""
        if blob[: len(COMPRESSED)] == COMPRESSED:
            (length,) = _RAW_LENGTH.unpack_from(blob, len(COMPRESSED))
            blob = pa.decompress(
                memoryview(blob)[len(COMPRESSED) + _RAW_LENGTH.size :],
                decompressed_size=length,
                codec="lz4",
                asbytes=True,
            )
        if blob[: len(MAGIC)] != MAGIC:
            raise ValueError("not a device table")
        at = len(MAGIC)
        n, p, e, b, words, count, *lengths = _HEADER.unpack_from(blob, at)
        at += _HEADER.size
        banks = [_BANK.unpack_from(blob, at + k * _BANK.size) for k in range(count)]
        at += count * _BANK.size
        banks += [(0, width) for width in state_sizes[len(banks) :]]  # banks added since start empty
        if [size for _, size in banks] != list(state_sizes):
            raise ValueError(
                f"device state holds detector rows of {[size for _, size in banks]} numbers, this job's detectors "
                f"keep {list(state_sizes)}: the detectors changed; start from a new checkpoint"
            )
        text = []
        for length in lengths[:4]:
            text.append(blob[at : at + length])
            at += length

        def array(dtype: str, rows: int, width: int = 0) -> np.ndarray:
            nonlocal at
            out = np.frombuffer(blob, dtype=dtype, count=rows * (width or 1), offset=at)
            at += out.nbytes
            return out.reshape(rows, width) if width else out

        type_codes, site_codes, name_codes = array("<i4", n), array("<i4", n), array("<i4", p)
        rows = {"device": n, "metric": p, "episode": e, "bucket": b}
        widths = {"seqs": words, **_WIDTHS}
        columns = {}
        for k, (name, stored, group) in enumerate(_COLUMNS):
            if k == _BANKS_AT:
                detectors = [array("<f8", count, size) for count, size in banks]
            columns[name] = array(stored, rows[group], widths.get(name, 0)).astype(
                _IN_MEMORY.get(name, stored), copy=False
            )
        return cls(
            ids=_strings(text[0].decode().split(_SEP)) if n else _strings([]),
            device_type=_decode_strings(text[1], type_codes),
            site=_decode_strings(text[2], site_codes),
            metric_name=_decode_strings(text[3], name_codes),
            detectors=detectors,
            **columns,
        )

    def counters(self, d: int = 0) -> dict[str, int]:
        """Device ``d``'s accounting counters by name."""
        return {name: int(self.core[d, CORE_FIELDS.index(name)]) for name in COUNTERS}
