"""The pure parts of `iotwatch chaos`: the seeded fault schedule and the growth slope."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest

from iotwatch.application.chaos.proofs import alerts_match, catch_up, commands, notifications
from iotwatch.application.chaos.resources import (
    Growth,
    Limits,
    Sample,
    anonymous_resident,
    judge,
    measure,
    pooled_threads,
    quiet_windows,
    shares_address_space,
    slope_per_minute,
)
from iotwatch.application.chaos.schedule import FAULT_KINDS, Action, ScheduleOptions, fault_kind, plan
from iotwatch.application.harness.results import as_json


def test_every_fault_kind_runs_at_least_once_in_order_within_the_run() -> None:
    for duration in (150.0, 600.0, 3600.0):
        options = ScheduleOptions(duration_s=duration, spacing_s=45.0)
        faults = plan(options)
        kinds = [f.kind for f in faults]
        assert set(kinds) == set(FAULT_KINDS)
        assert len(kinds) % len(FAULT_KINDS) == 0  # whole cycles: every kind equally often
        times = [f.at_s for f in faults]
        assert times == sorted(times)
        assert options.lead_s <= times[0] and times[-1] <= duration - options.tail_s
    assert len(plan(ScheduleOptions(duration_s=3600.0, spacing_s=45.0))) == 70  # 3,555 s of 45 s slots, whole cycles


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    one, again, other = (plan(ScheduleOptions(duration_s=600.0, seed=s)) for s in (7, 7, 8))
    assert one == again
    assert [f.kind for f in one] != [f.kind for f in other]


def test_a_chosen_kind_repeats_through_the_run() -> None:
    pause = fault_kind("kafka pause")
    faults = plan(ScheduleOptions(duration_s=300.0, spacing_s=20.0, lead_s=15.0, kinds=(pause,)))
    assert {f.kind for f in faults} == {pause} and len(faults) == 13  # 270 s of 20 s slots
    with pytest.raises(ValueError, match="known: gateway kill -9"):
        fault_kind("kafka reboot")


def test_holds_vary_around_the_kill_and_pause_holds() -> None:
    faults = plan(ScheduleOptions(duration_s=3600.0, kill_hold_s=4.0, pause_hold_s=20.0))
    pauses = [f.hold_s for f in faults if f.kind.action is Action.PAUSE]
    kills = [f.hold_s for f in faults if f.kind.action is not Action.PAUSE]
    assert all(10.0 <= h <= 30.0 for h in pauses) and all(2.0 <= h <= 6.0 for h in kills)


def test_slope_is_fitted_within_incarnations_after_warm_up() -> None:
    """Two incarnations growing 2 MB a minute each, restarted small: the pooled slope is
    2 MB/min (a fit across the restart would see a drop); the warm-up's steep start is left out."""
    points = []
    for pid, start in ((1, 0.0), (2, 400.0)):
        for t in np.arange(start, start + 300.0, 5.0):
            age = t - start
            value = 50e6 + (age * 1e6 if age < 60 else 60e6 + (age - 60) / 60 * 2e6)
            points.append((float(t), pid, value))
    slope, span, error = slope_per_minute(points, warm_up_s=60.0, min_span_s=120.0)
    assert slope == pytest.approx(2e6, rel=1e-6)
    assert span == pytest.approx(2 * 235.0)
    assert error == pytest.approx(0.0, abs=1.0)  # on the line: no scatter


def test_slope_is_not_judged_on_too_short_a_run() -> None:
    points = [(float(t), 1, 1e6 * t) for t in range(0, 100, 5)]
    assert slope_per_minute(points, warm_up_s=30.0, min_span_s=120.0) == (None, 0.0, 0.0)


def test_quiet_windows_leave_out_each_fault_until_it_recovered() -> None:
    disturbed = [(100.0, 130.0), (120.0, 150.0), (300.0, 900.0)]  # overlapping; the last never recovered
    assert quiet_windows(disturbed, end_s=600.0) == [(0.0, 100.0), (150.0, 300.0)]
    assert quiet_windows([], end_s=60.0) == [(0.0, 60.0)]


def test_a_buffer_filled_by_each_fault_is_not_growth_but_growth_between_faults_is() -> None:
    """A process whose memory steps up 20 MB during each fault and stays flat between faults
    is within limits once the faults are left out; a fit over the whole run sees 4 MB/min.
    One that also grows 2 MB/min between faults fails either way."""
    faults = [(float(f), float(f) + 20.0) for f in range(150, 900, 150)]
    windows = quiet_windows(faults, end_s=900.0)
    rng = np.random.default_rng(3)

    def rss(t: float, between: float) -> float:
        steps = sum(1 for begin, _ in faults if t >= begin)
        return 1e8 + steps * 20e6 + between * t / 60 + rng.normal(0, 2e5)

    samples = [
        Sample(float(t), name, 10, int(rss(t, between)), 40, 12, int(rss(t, between)))
        for t in range(0, 900, 5)
        for name, between in (("buffering", 0.0), ("leaky", 2e6))
    ]
    whole = judge(samples, Limits(), warm_up_s=60.0, min_span_s=120.0)
    quiet = judge(samples, Limits(), warm_up_s=60.0, min_span_s=120.0, windows=windows)
    assert whole["buffering"]["within_limits"] is False
    assert quiet["buffering"]["within_limits"] is True
    assert quiet["buffering"]["anon_bytes"]["fitted_s"] == pytest.approx(85.0 + 5 * 125.0)  # warm-up, then 5 s steps
    assert quiet["leaky"]["within_limits"] is False
    assert quiet["leaky"]["anon_bytes"]["slope_per_min"] == pytest.approx(2e6, rel=0.05)


def test_threads_rebuilt_after_each_fault_are_not_growth_but_threads_each_fault_leaves_are() -> None:
    """A job whose threads drop by 18 at each fault and come back over the 40 s after its
    recovery (clients reconnecting) is within limits, though each quiet window alone starts
    with a ramp; one that keeps 3 more threads after every fault and is flat between faults
    fails, though each quiet window alone is flat."""
    faults = [(float(f), float(f) + 15.0) for f in range(150, 900, 75)]
    windows = quiet_windows(faults, end_s=900.0)
    rng = np.random.default_rng(5)

    def threads(t: float, kept_per_fault: int) -> int:
        recovered = [end for _, end in faults if t >= end]
        since = t - recovered[-1] if recovered else 1e9
        ramp = 18.0 * max(0.0, 1.0 - since / 40.0)
        return int(140 + kept_per_fault * len(recovered) - ramp + rng.integers(0, 8))

    samples = [
        Sample(float(t), name, 10, 0, 450, threads(t, kept), 0)
        for t in range(0, 900, 5)
        for name, kept in (("reconnecting", 0), ("leaving", 3))
    ]
    report = judge(samples, Limits(), warm_up_s=120.0, min_span_s=120.0, windows=windows)
    assert report["reconnecting"]["within_limits"] is True
    assert report["leaving"]["within_limits"] is False
    per_window = slope_per_minute(
        [(s.t, s.pid, s.threads) for s in samples if s.process == "reconnecting"], 120.0, 120.0, windows
    )
    assert per_window.exceeds(1.0)  # the ramps alone, each window with its own level


def test_a_process_growing_above_the_limit_fails_and_a_flat_noisy_one_passes() -> None:
    """Growth is judged on anonymous memory: a process whose RSS grows only by mapped files
    (a server's data files read into the page cache) passes, and its RSS slope is reported."""
    rng = np.random.default_rng(1)
    samples = [
        Sample(float(t), name, 10, int(rss), 40, 12, int(anon))
        for t in range(0, 900, 5)
        for name, rss, anon in (
            ("leaky", 1e8 + t / 60 * 3e6, 5e7 + t / 60 * 3e6),
            ("steady", 1e8 + rng.normal(0, 2e6), 5e7 + rng.normal(0, 2e6)),
            ("mapping", 1e8 + t / 60 * 3e6, 5e7 + rng.normal(0, 2e6)),
        )
    ]
    report = judge(samples, Limits(), warm_up_s=120.0, min_span_s=120.0)
    assert report["leaky"]["within_limits"] is False
    assert report["leaky"]["anon_bytes"]["slope_per_min"] == pytest.approx(3e6, rel=1e-3)
    assert report["steady"]["within_limits"] is True
    assert report["mapping"]["within_limits"] is True
    assert report["mapping"]["rss_bytes"]["slope_per_min"] == pytest.approx(3e6, rel=1e-3)
    assert report["mapping"]["rss_bytes"]["limit_per_min"] is None


def test_threads_coming_and_going_with_tasks_pass_a_short_run_and_a_leak_fails_it() -> None:
    """Four minutes of a job whose threads scatter by a few with the tasks in flight fit a
    slope above one a minute by chance, within two standard errors: not judged growth. A
    thread leaked every 20 s through the same scatter fails; so does a slope of 1.5 a minute
    kept up over an hour, whose standard error is a tenth."""
    rng = np.random.default_rng(7)

    def run(seconds: int, per_min: float) -> list[Sample]:
        return [
            Sample(float(t), "stream", 10, 0, 450, int(130 + per_min * t / 60 + rng.integers(0, 12)), 0)
            for t in range(0, seconds, 5)
        ]

    def verdict(samples: list[Sample]) -> tuple[bool | None, dict[str, float]]:
        entry = judge(samples, Limits(), warm_up_s=120.0, min_span_s=120.0)["stream"]
        return entry["within_limits"], entry["threads"]

    tasks, leak, hour = run(360, 0.0), run(360, 3.0), run(3600, 1.5)
    assert verdict(tasks)[0] is True and verdict(tasks)[1]["slope_error_per_min"] > 0.3
    assert verdict(leak)[0] is False
    ok, threads = verdict(hour)
    assert ok is False and threads["slope_error_per_min"] < 0.1
    noisy = Growth(1.6, 240.0, 1.4)
    assert not noisy.exceeds(1.0) and Growth(1.6, 3600.0, 0.1).exceeds(1.0)


def test_anonymous_resident_memory_is_read_from_the_kernel() -> None:
    """This process's RssAnon: positive and at most its RSS."""
    me = psutil.Process()
    rss = me.memory_info().rss
    anon = anonymous_resident(me.pid, rss)
    assert 0 < anon <= rss


_CLONE_STACKS: list[ctypes.Array[ctypes.c_char]] = []


def _clone_sharing_memory() -> int:
    """A child process in this process's address space (``clone(CLONE_VM)``, as ``vfork`` and
    ``posix_spawn`` make before their exec), waiting in ``pause()`` on a stack of its own."""
    libc = ctypes.CDLL(None, use_errno=True)
    stack = ctypes.create_string_buffer(1 << 16)
    _CLONE_STACKS.append(stack)  # the child runs on it: kept for the whole session
    libc.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    top = ctypes.addressof(stack) + len(stack) - 16
    pid = libc.clone(ctypes.cast(libc.pause, ctypes.c_void_p), top, 0x100 | signal.SIGCHLD, None)  # CLONE_VM
    assert pid > 0, os.strerror(ctypes.get_errno())
    return int(pid)


def test_a_child_in_its_parent_s_address_space_is_not_counted_twice() -> None:
    """A child between clone and exec reports its parent's memory, fds and more as its own:
    the tree's measure leaves it out; a child with an address space of its own counts."""
    me = psutil.Process()
    alias = _clone_sharing_memory()
    own = subprocess.Popen(["sleep", "30"])
    try:
        assert shares_address_space(alias, me.pid) and not shares_address_space(own.pid, me.pid)
        alone, with_alias, with_own = (
            measure(tree) for tree in ([me], [me, psutil.Process(alias)], [me, psutil.Process(own.pid)])
        )
        assert alone is not None and with_alias is not None and with_own is not None
        assert with_alias[1] == alone[1] and with_alias[2] == alone[2]  # fds and threads
        assert with_alias[3] < 1.5 * alone[3]  # anonymous memory (this process's may move a little)
        assert with_own[2] == alone[2] + 1  # sleep's one thread
    finally:
        os.kill(alias, signal.SIGKILL)
        os.waitpid(alias, 0)
        own.kill()
        own.wait()


def _named_threads(names: list[str], stop: threading.Event) -> list[threading.Thread]:
    """Threads whose kernel names (``comm``) are ``names``, waiting for ``stop``."""
    libc = ctypes.CDLL(None)
    started = threading.Barrier(len(names) + 1)

    def run(name: str) -> None:
        libc.prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME: this thread's comm
        started.wait()
        stop.wait()

    threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in names]
    for thread in threads:
        thread.start()
    started.wait()
    return threads


def test_threads_of_the_bounded_pools_are_counted_apart() -> None:
    """Threads named as Spark's block-manager pools are pooled_threads; the rest are threads."""
    stop = threading.Event()
    before = measure([psutil.Process()])
    assert before is not None
    threads = _named_threads(["block-manager-ask-thread-pool-3", "block-manager-storage-async-1", "worker-7"], stop)
    try:
        assert pooled_threads(psutil.Process().pid) == 2
        after = measure([psutil.Process()])
        assert after is not None
        assert after[2] == before[2] + 1  # worker-7
        assert after[4] == before[4] + 2
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def test_files_held_open_in_the_data_folder_are_data_files_and_a_removed_one_an_fd(tmp_path: Path) -> None:
    """A server's data files held open (a TSM file per cache snapshot until a compaction merges
    them) are counted once each as data_files, not fds; a file removed but still open is an fd."""
    before = measure([psutil.Process()], tmp_path)
    paths = [tmp_path / f"{generation:06d}-01.tsm" for generation in range(3)]
    for path in paths:
        path.write_bytes(b"tsm")
    handles = [path.open("rb") for path in [*paths, paths[0]]]  # the first file twice
    try:
        held = measure([psutil.Process()], tmp_path)
        paths[1].unlink()  # compacted away, never closed: a leak
        leaked = measure([psutil.Process()], tmp_path)
        assert before is not None and held is not None and leaked is not None
        assert (held[5] - before[5], held[1] - before[1]) == (3, 1)  # the second handle of one file
        assert (leaked[5] - before[5], leaked[1] - before[1]) == (2, 2)
    finally:
        for handle in handles:
            handle.close()


def test_a_bounded_pool_filling_to_its_cap_is_reported_not_judged() -> None:
    """A JVM whose pools jump from 10 to 200 threads mid-run passes on threads; the same jump
    outside the pools fails."""
    samples = [
        Sample(float(t), name, 10, 10**8, 40, 130 + (jump if name == "leaky" and t > 400 else 0), 10**8, pooled)
        for t in range(0, 900, 5)
        for jump in (190,)
        for name, pooled in (("pooled", 10 if t <= 400 else 200), ("leaky", 10))
    ]
    report = judge(samples, Limits(), warm_up_s=120.0, min_span_s=120.0)
    assert report["pooled"]["within_limits"] is True
    assert report["pooled"]["pooled_threads"]["slope_per_min"] > 1.0
    assert report["pooled"]["pooled_threads"]["limit_per_min"] is None
    assert report["leaky"]["within_limits"] is False


def _alert(alert_id: str, state: str = "raised", rule: str = "anomaly_score") -> object:
    from tests.unit.demo.test_accounting import alert

    return alert(alert_id, "d1", rule, 5, state=state)


def test_alert_ids_equal_the_replay_s_without_the_responder_s_escalations_and_the_outages() -> None:
    live = {i: _alert(i) for i in ("a", "b")} | {
        "e": _alert("e", rule="command_escalation"),
        "g": _alert("g", rule="ingestion_gap"),
    }
    same = as_json(alerts_match(live, {i: _alert(i) for i in ("a", "b")}))  # the summary's keys
    assert same["ok"] and same["responder_escalations_left_out"] == 1 and same["ingestion_gaps_left_out"] == 1
    differs = as_json(alerts_match(live, {i: _alert(i) for i in ("a", "c")}))
    assert not differs["ok"]
    assert (differs["only_live"], differs["only_replay"]) == ({"b": "anomaly_score"}, {"c": "anomaly_score"})


def test_notifications_are_proved_per_alert_record_and_repeats_removed_by_key() -> None:
    from collections import Counter

    alerts = [_alert("a"), _alert("a", state="cleared"), _alert("b")]
    received = Counter({"a:raised": 2, "a:cleared": 1, "b:raised": 1})
    proof = as_json(notifications(alerts, received))
    assert proof["ok"] and proof["duplicates_removed_by_key"] == 1 and proof["unique_after_dedup"] == 3
    assert notifications(alerts, Counter({"a:raised": 1})).missing == ["a:cleared", "b:raised"]


def test_commands_end_acknowledged_or_expired_by_their_latest_audit() -> None:
    import msgspec

    from iotwatch.contract.oncall import CommandAudit

    def audit(command: str, status: str) -> CommandAudit:
        fields = {"v": 1, "command_id": command, "policy": "p", "alert_id": "a", "rule": "r", "device_id": "d"}
        fields |= {"device_type": "t", "site": "s", "name": "close_valve", "issued_by": "responder"}
        fields |= {"issued_at_ms": 1, "expires_at_ms": 2, "attempt": 1, "status": status}
        return msgspec.convert(fields, CommandAudit)

    history = [audit("c1", "sent"), audit("c1", "done"), audit("c2", "sent"), audit("c2", "timed_out")]
    assert as_json(commands(history)) | {"by_status": None} == {
        "ok": True,
        "commands": 2,
        "acknowledged": 1,
        "expired": 1,
        "audit_records": 4,
        "by_status": None,
        "open": [],
    }
    assert commands([*history, audit("c3", "accepted")]).open == ["c3"]


def test_the_lag_is_judged_back_at_its_fault_free_level_between_faults() -> None:
    """The level is 10 s of input (300 records at 30 a second); after the first fault the lag
    is back there 4 s after recovery, after the second it never is before the third; the
    third is followed by the end of the load within 20 s and is not judged."""
    faults = [
        {"fault": "gateway kill -9", "injected_at_s": 30.0, "recovery_s": 10.0},
        {"fault": "kafka pause", "injected_at_s": 60.0, "recovery_s": 10.0},
        {"fault": "mqtt pause", "injected_at_s": 90.0, "recovery_s": 9.0},
    ]
    lag = [(float(t), 9000 if t < 30 else 5000 if t < 44 else 200 if t < 60 else 4000) for t in range(0, 100)]
    result = as_json(catch_up(faults, lag, load_s=100.0, rate=30.0))
    assert result["level"] == 300 and result["lead_in_max_lag"] == 9000 and result["judged"] == 2
    assert not result["ok"] and result["not_caught_up"] == ["kafka pause"]
    assert faults[0]["caught_up_s"] == 4.0 and faults[1]["caught_up_s"] is None and "caught_up_s" not in faults[2]
