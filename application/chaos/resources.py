"""Resources over a run: RSS, open file descriptors and threads of every process, sampled
as the run goes, and their growth per minute after warm-up, judged only while nothing is
disturbed (docs/operate/chaos.md, *Resources*, says why and how: one least-squares slope
shared by each incarnation's quiet windows).
"""

from __future__ import annotations

import ctypes
import os
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import psutil

#: What is sampled per process tree; growth is judged on ``anon_bytes`` (memory only the process
#: can free), not on RSS, which counts mapped files the kernel reclaims (docs/operate/chaos.md).
MEASURES = ("rss_bytes", "anon_bytes", "fds", "threads", "pooled_threads", "data_files")
#: Counts a process gives back when the work that needed them ends (a fault's reconnects
#: included): fitted with one level per incarnation across its quiet windows, so that what a
#: fault leaves behind is growth and a ramp while clients reconnect after one is not.
COUNTS = ("fds", "threads", "pooled_threads", "data_files")

#: Thread names (``/proc/<pid>/task/<tid>/comm``, cut to 15 characters) of Spark's block-manager
#: pools, capped in their own source and filled by bursts at no fixed time: counted as
#: ``pooled_threads``, reported and not judged (docs/operate/chaos.md); ``threads`` is the rest.
BOUNDED_POOL_THREADS = ("block-manager-a", "block-manager-s")


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # seconds since the run started
    process: str
    pid: int  # the incarnation
    rss_bytes: int
    fds: int
    threads: int  # outside the bounded pools
    anon_bytes: int = 0
    pooled_threads: int = 0  # in the bounded pools (BOUNDED_POOL_THREADS)
    data_files: int = 0  # files of the data folder held open (held_files), not among fds


@dataclass(frozen=True)
class Limits:
    """Largest growth per minute tolerated after warm-up (None: reported, not judged)."""

    rss_bytes: float | None = None
    anon_bytes: float | None = 1_000_000.0
    fds: float | None = 1.0
    threads: float | None = 1.0
    pooled_threads: float | None = None
    data_files: float | None = None


def measure(tree: list[psutil.Process], data_dir: Path | None = None) -> tuple[int, int, int, int, int, int] | None:
    """RSS, fds (but the data files), threads outside the bounded pools, anonymous resident
    memory, threads in them and files under ``data_dir`` held open (:func:`held_files`), summed
    over a process and its children (the job's JVM, a server's workers); None when the process
    is gone. A child that shares its parent's address space is not counted: between
    ``posix_spawn``'s clone and its exec a JVM's child reports the JVM's whole memory as its
    own, so a sample taken then would count the JVM twice."""
    rss = fds = threads = anon = pooled = held = 0
    for proc in tree:
        try:
            if proc is not tree[0] and shares_address_space(proc.pid, proc.ppid()):
                continue
            with proc.oneshot():
                resident = proc.memory_info().rss
                rss += resident
                fds += proc.num_fds()
                threads += proc.num_threads()
            anon += anonymous_resident(proc.pid, resident)
            pooled += pooled_threads(proc.pid)
            held += held_files(proc.pid, data_dir) if data_dir is not None else 0
        except psutil.Error:
            if proc is tree[0]:
                return None
    return (rss, fds - held, threads - pooled, anon, pooled, held) if tree else None


def held_files(pid: int, data_dir: Path) -> int:
    """Files under ``data_dir`` (the stack's servers' folders) that ``pid`` holds open and that
    still exist: the data a server keeps (InfluxDB's TSM files, one more per cache snapshot
    until a compaction merges them; Kafka's segments until retention), each file once. A
    file removed but still open is not among them: it stays a judged fd, the leak it is."""
    prefix, held = f"{data_dir}/", set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0  # gone meanwhile, or not Linux: every fd is judged
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith(prefix) and not target.endswith(" (deleted)"):
            held.add(target)
    return len(held)


#: Linux's ``kcmp`` system call, per architecture, and its ``KCMP_VM`` comparison.
_KCMP_SYSCALL = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
_KCMP_VM = 1
_libc = ctypes.CDLL(None, use_errno=True) if _KCMP_SYSCALL is not None else None


def shares_address_space(pid: int, other: int) -> bool:
    """Whether two processes run in one address space (``kcmp(KCMP_VM)``): a ``vfork`` or
    ``posix_spawn`` child before its exec. False where the kernel cannot tell."""
    if _libc is None or pid == other:
        return False
    return bool(_libc.syscall(_KCMP_SYSCALL, pid, other, _KCMP_VM, 0, 0) == 0)


def pooled_threads(pid: int) -> int:
    """Threads of ``pid`` in the bounded pools named by :data:`BOUNDED_POOL_THREADS`."""
    count = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0  # gone meanwhile, or not Linux: every thread counts as unpooled
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as comm:
                count += comm.read().startswith(BOUNDED_POOL_THREADS)
        except OSError:
            continue  # the thread ended meanwhile
    return count


def anonymous_resident(pid: int, rss: int) -> int:
    """The process's anonymous resident bytes (``RssAnon`` of ``/proc/<pid>/status``); its
    RSS where the kernel does not report it."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass  # gone meanwhile, or not Linux: RSS is the best measure left
    return rss


class Sampler:
    """Samples named process trees; ``trees`` returns name -> (pid, tree) of what runs now."""

    def __init__(
        self,
        trees: Callable[[], dict[str, tuple[int, list[psutil.Process]]]],
        started: float,
        data_dir: Path | None = None,
    ) -> None:
        self.trees = trees
        self.started = started
        self.data_dir = data_dir  # files held open under it are data_files, not fds
        self.samples: list[Sample] = []
        self.state_store: list[tuple[float, int]] = []

    def sample(self, state_dir: Path | None = None) -> None:
        now = time.time() - self.started
        for name, (pid, tree) in self.trees().items():
            found = measure(tree, self.data_dir)
            if found is not None:
                self.samples.append(Sample(now, name, pid, *found))
        if state_dir is not None:
            self.state_store.append((now, directory_bytes(state_dir)))


def directory_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 when it does not exist yet)."""
    total = 0
    for path in folder.rglob("*") if folder.exists() else ():
        try:
            total += path.stat().st_size if path.is_file() else 0
        except OSError:
            continue  # removed by Spark's maintenance meanwhile
    return total


#: A stretch of the run, ``(start_s, end_s)``.
Window = tuple[float, float]


def quiet_windows(disturbed: Sequence[Window], end_s: float) -> list[Window]:
    """The stretches of ``[0, end_s]`` outside every ``disturbed`` one (a fault from its
    injection until it recovered; one that never recovered disturbs the rest of the run)."""
    windows, start = [], 0.0
    for begin, end in sorted(disturbed):
        if begin > start:
            windows.append((start, begin))
        start = max(start, end)
    if start < end_s:
        windows.append((start, end_s))
    return windows


class Growth(NamedTuple):
    """A fitted growth: per minute (None: too little to judge), the seconds of samples it used
    and its standard error per minute (from the samples' scatter about the fit)."""

    per_min: float | None
    fitted_s: float
    error_per_min: float = 0.0

    def exceeds(self, limit: float) -> bool:
        """Growth faster than ``limit`` beyond its noise: the slope more than two standard
        errors above the limit. A short fit over noisy samples (threads coming and going with
        tasks, a garbage-collected heap's saw-tooth) cannot show a slope near the limit; the
        same rate over an hour's samples can."""
        return self.per_min is not None and self.per_min - 2.0 * self.error_per_min > limit


def slope_per_minute(
    points: Iterable[tuple[float, int, float]],
    warm_up_s: float,
    min_span_s: float,
    windows: Sequence[Window] | None = None,
    shared_level: bool = False,
) -> Growth:
    """Growth per minute of ``(t_s, incarnation, value)`` points, pooled over stretches
    (each with its own level): one per incarnation and window of ``windows`` (default: the
    whole run), or with ``shared_level`` one per incarnation over its points in ``windows``,
    from ``warm_up_s`` after each incarnation's first point; not judged when the windows'
    points span less than ``min_span_s`` in all."""
    by_incarnation: dict[int, list[tuple[float, float]]] = {}
    for t, incarnation, value in points:
        by_incarnation.setdefault(incarnation, []).append((t, value))
    stretches: list[tuple[np.ndarray, np.ndarray]] = []
    span = 0.0
    for series in by_incarnation.values():
        series.sort()
        start = series[0][0] + warm_up_s
        kept = [
            np.array([(t, v) for t, v in series if t >= start and low <= t < high], dtype=float).reshape(-1, 2)
            for low, high in (windows if windows is not None else [(-np.inf, np.inf)])
        ]
        span += sum(float(k[-1, 0] - k[0, 0]) for k in kept if len(k) >= 3)
        for k in [np.concatenate(kept)] if shared_level else kept:
            if len(k) >= 3:
                stretches.append((k[:, 0] - k[:, 0].mean(), k[:, 1] - k[:, 1].mean()))
    denominator = sum(float(t @ t) for t, _ in stretches)
    if denominator == 0.0 or span < min_span_s:
        return Growth(None, 0.0)
    slope = sum(float(t @ v) for t, v in stretches) / denominator
    # residuals about one slope and a level per stretch: n - stretches - 1 degrees of freedom
    freedom = sum(len(t) for t, _ in stretches) - len(stretches) - 1
    scatter = sum(float(((v - slope * t) ** 2).sum()) for t, v in stretches) / max(freedom, 1)
    return Growth(slope * 60.0, span, float(np.sqrt(scatter / denominator)) * 60.0)


def judge(
    samples: list[Sample],
    limits: Limits,
    warm_up_s: float,
    min_span_s: float,
    windows: Sequence[Window] | None = None,
) -> dict[str, Any]:
    """Per process: incarnations, last and peak values, slope per minute of each measure
    within ``windows`` (see :func:`slope_per_minute`) and its standard error, and whether it
    stays within ``limits`` (:meth:`Growth.exceeds`; ``None``: the run was too short to judge)."""
    report: dict[str, Any] = {}
    for name in sorted({s.process for s in samples}):
        own = [s for s in samples if s.process == name]
        entry: dict[str, Any] = {"incarnations": len({s.pid for s in own}), "samples": len(own)}
        within: list[bool] = []
        for measure_name in MEASURES:
            values = [(s.t, s.pid, float(getattr(s, measure_name))) for s in own]
            growth = slope_per_minute(values, warm_up_s, min_span_s, windows, measure_name in COUNTS)
            limit = getattr(limits, measure_name)  # None: reported, not judged
            entry[measure_name] = {
                "last": int(values[-1][2]),
                "peak": int(max(v for _, _, v in values)),
                "slope_per_min": None if growth.per_min is None else round(growth.per_min, 3),
                "slope_error_per_min": round(growth.error_per_min, 3),
                "fitted_s": round(growth.fitted_s, 1),
                "limit_per_min": limit,
            }
            if growth.per_min is not None and limit is not None:
                within.append(not growth.exceeds(limit))
        entry["within_limits"] = all(within) if within else None
        report[name] = entry
    return report
