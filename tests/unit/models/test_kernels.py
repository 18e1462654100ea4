"""Every compiled kernel (models/kernels/) agrees with its reference detector (models/):
same scores, same final state, whatever the data. The shared checks run over every kernel
of :data:`iotwatch.models.kernels.KERNELS`; the tail ensemble's own checks follow."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import pytest

from iotwatch.devices.config import SimConfig
from iotwatch.devices.simulation import STATUS, Simulation
from iotwatch.evaluation.sources import NAB_SAMPLE, NabSource
from iotwatch.models.base import Detector
from iotwatch.models.exceedance import ExceedanceTail
from iotwatch.models.forecast import HoltWintersResidual
from iotwatch.models.kernels import KERNELS, kernel_for
from iotwatch.models.kernels import tail_ensemble as kernel
from iotwatch.models.repeat_run import RepeatRun
from iotwatch.models.robust_zscore import RobustZScore
from iotwatch.models.tail_ensemble import TailEnsemble
from tests.unit.models.test_detector_kernels import WRAPPED

RTOL, ATOL = 1e-9, 1e-12
START_MS = 1_763_784_000_000

#: Offsets holding counts and signs: these must agree exactly, not within a tolerance.
TAIL_COUNTERS = [kernel.TAIL_N, kernel.TAIL_PEAKS, kernel.TAIL_GAP]
COUNTERS = [
    kernel.ENSEMBLE_N,
    kernel.LEVEL_N,
    kernel.CHANGE_N,
    kernel.CHANGE_BEYOND,
    kernel.STUCK_N,
    kernel.STUCK_RUN,
    kernel.STUCK_DIRECTION,
] + [base + k for base in (kernel.LEVEL_TAIL, kernel.CHANGE_TAIL) for k in TAIL_COUNTERS]

Readings = tuple[np.ndarray, np.ndarray, np.ndarray]  # stream (int64), values (float64), t_ms (int64)


@dataclass(frozen=True)
class Case:
    """A kernel, how to build its reference detector, and its row's exact offsets."""

    kernel: ModuleType
    make: Callable[[], Detector]
    counters: list[int]
    #: False for a detector without a hold: its surprise is its score (not computed apart).
    held: bool = True
    #: True when a score of 1.0 is in its range (CAD OSE: nothing selected came true, all new).
    reaches_one: bool = False


CASES = {
    "tail_ensemble": Case(kernel, TailEnsemble, COUNTERS),
}


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> Case:
    return CASES[request.param]


def test_every_kernel_is_checked_here() -> None:
    assert set(CASES) | set(WRAPPED) == set(KERNELS)
    for name, c in CASES.items():
        assert kernel_for(name) is c.kernel and c.make().name == name


def reference(
    make: Callable[[], Detector], readings: Readings, surprises: np.ndarray | None = None, held: bool = True
) -> tuple[np.ndarray, dict[int, Detector]]:
    """One reference detector per stream, fed in order: the scores and the detectors (and
    each reading's ``surprise_one`` into ``surprises``: its score when not ``held``)."""
    detectors: dict[int, Detector] = {}
    scores = np.empty(len(readings[0]))
    for i, (s, v, t) in enumerate(zip(*(a.tolist() for a in readings), strict=True)):
        if s not in detectors:
            detectors[s] = make()
        det = detectors[s]
        x = {det.metric or "m": v}
        if surprises is not None and held:
            surprises[i] = det.surprise_one(x, t)
        scores[i] = det.score_learn_one(x, t)
        if surprises is not None and not held:
            surprises[i] = scores[i]
    return scores, detectors


def fresh_states(make: Callable[[], Detector], n_streams: int, k: ModuleType = kernel) -> tuple[np.ndarray, np.ndarray]:
    params = k.params_vector(make())
    return np.tile(k.initial_state(params), (n_streams, 1)), params


def assert_same_state(
    row: np.ndarray, detector: Detector, *, rebuild: bool = True, case: Case = CASES["tail_ensemble"]
) -> None:
    k = case.kernel
    expected = k.from_reference(detector)
    np.testing.assert_allclose(row, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
    assert row[case.counters].tolist() == expected[case.counters].tolist()
    if rebuild:  # the row rebuilt as a reference detector holds the same state
        back = k.to_reference(row, detector.get_params())
        np.testing.assert_array_equal(k.from_reference(back), row)


def assert_agree(
    make: Callable[[], Detector],
    readings: Readings,
    n_streams: int,
    *,
    rebuild: bool = True,
    case: Case = CASES["tail_ensemble"],
) -> np.ndarray:
    """All readings through one kernel call agree with per-stream reference detectors, and
    so do the surprises (the scores before any hold)."""
    ref_surprises = np.empty(len(readings[0]))
    ref_scores, detectors = reference(make, readings, ref_surprises, case.held)
    states, params = fresh_states(make, n_streams, case.kernel)
    surprises = np.full(len(readings[0]), np.nan)
    scores = case.kernel.score_learn_into(states, *readings, params, surprises)
    np.testing.assert_allclose(scores, ref_scores, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(surprises, ref_surprises, rtol=RTOL, atol=ATOL)
    assert (surprises >= scores).all()  # a hold only ever lowers a score
    for s in range(n_streams):
        assert_same_state(states[s], detectors[s] if s in detectors else make(), rebuild=rebuild, case=case)
    return scores


def interleave(columns: list[tuple[np.ndarray, np.ndarray]], seed: int) -> Readings:
    """Streams' (values, t_ms) merged in a random order that keeps each stream's own order."""
    rng = np.random.default_rng(seed)
    stream = rng.permutation(np.repeat(np.arange(len(columns)), [len(v) for v, _ in columns]))
    values, t_ms = np.empty(len(stream)), np.empty(len(stream), dtype=np.int64)
    for s, (v, t) in enumerate(columns):
        at = np.flatnonzero(stream == s)
        values[at], t_ms[at] = v, t
    return stream.astype(np.int64), values, t_ms


@pytest.fixture(scope="module")
def nab() -> Readings:
    """The shipped NAB sample's seven streams, interleaved."""
    return interleave(
        [(s.values[:, 0].astype(float), s.t_ms.astype(np.int64)) for s in NabSource(NAB_SAMPLE).streams()], seed=3
    )


@pytest.fixture(scope="module")
def fleet() -> tuple[Readings, int]:
    """A simulated fleet with anomalies and transport faults: one stream per (device_id,
    metric), every reading in the simulator's order (NaN where a payload carries one)."""
    config = SimConfig(
        seed=4,
        homes=8,
        vehicles=1,
        start_ms=START_MS,
        rate=1 / 15,
        vehicle_hz=0.5,
        anomaly_rate=2.0,
        fault_rate=2.0,
        tick_ms=5000,
    )
    keys: dict[tuple[str, str], int] = {}
    stream, values, t_ms = [], [], []
    for batch in Simulation(config).run(2 * 3600):
        for _uid, _topic, payload, group in batch:
            if group == STATUS:
                continue
            try:
                message = json.loads(payload)
            except ValueError:  # a malformed payload: dead letters, never scored
                continue
            for metric, value in message["metrics"].items():
                stream.append(keys.setdefault((message["device_id"], metric), len(keys)))
                values.append(float(value))
                t_ms.append(int(message["ts"]))
    return (np.array(stream, dtype=np.int64), np.array(values), np.array(t_ms, dtype=np.int64)), len(keys)


def test_nab_sample_every_stream_alone(case: Case) -> None:
    case.kernel.warm()
    for labelled in NabSource(NAB_SAMPLE).streams():
        readings = (
            np.zeros(len(labelled), dtype=np.int64),
            labelled.values[:, 0].astype(float),
            labelled.t_ms.astype(np.int64),
        )
        scores = assert_agree(case.make, readings, 1, case=case)
        assert scores.max() > 0.0 or labelled.key.endswith("art_flatline.csv"), labelled.key


def test_nab_sample_interleaved_in_one_call(nab: Readings, case: Case) -> None:
    assert_agree(case.make, nab, 7, case=case)


def test_simulated_fleet_interleaved_in_one_call(fleet: tuple[Readings, int], case: Case) -> None:
    readings, n_streams = fleet
    assert n_streams > 100 and np.isnan(readings[1]).any()
    scores = assert_agree(case.make, readings, n_streams, case=case)
    assert (scores > 0.5).any()  # the injected anomalies score


def test_micro_batches_of_uneven_sizes_equal_one_call(fleet: tuple[Readings, int], case: Case) -> None:
    readings, n_streams = fleet
    k = case.kernel
    whole_states, params = fresh_states(case.make, n_streams, k)
    whole = k.score_learn(whole_states, *readings, params)
    rng = np.random.default_rng(8)
    cuts = np.sort(np.concatenate([rng.integers(0, len(whole), 40), [0, 0, 1]]))  # an empty batch, a batch of one
    bounds = np.concatenate([[0], cuts, [len(whole)]])
    states, _ = fresh_states(case.make, n_streams, k)
    parts = [
        k.score_learn(states, *(a[lo:hi] for a in readings), params)
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    np.testing.assert_array_equal(states, whole_states)


def test_non_finite_and_extreme_values(case: Case) -> None:
    rng = np.random.default_rng(11)
    n = 3000
    noisy = np.round(rng.normal(20.0, 0.3, n), 2)
    noisy[rng.integers(0, n, 120)] = rng.choice([np.nan, np.inf, -np.inf, 1e308, -1e308, 1e100, -0.0], 120)
    zero_runs = np.where((np.arange(n) // 150) % 2 == 0, 0.0, np.round(rng.normal(0.0, 1.0, n), 1))
    giant = rng.choice([1e308, -1e308, 1e-300, 5e99, -5e99, 0.0], n)
    sticky = np.repeat(np.round(rng.normal(50.0, 5.0, n // 10), 1), 10)
    sticky[rng.integers(0, n, 30)] = rng.choice([1e6, -1e6, np.nan], 30)
    columns = [
        noisy,
        zero_runs,
        np.full(n, 45.0),
        giant,
        np.full(n, np.nan),
        rng.choice([np.nan, np.inf, -np.inf, 3.0], n),
        sticky,
        np.full(n, -1e308),
    ]
    t = START_MS + np.arange(n, dtype=np.int64) * 1000
    readings = interleave([(c, t) for c in columns], seed=5)
    scores = assert_agree(case.make, readings, len(columns), case=case)
    assert np.isfinite(scores).all() and scores.min() >= 0.0 and scores.max() <= 1.0
    assert scores.max() < 1.0 or case.reaches_one
    assert (scores[~np.isfinite(readings[1])] == 0.0).all()


def custom_members() -> TailEnsemble:
    """Members built unlike the ensemble's own: the kernel reads them, not its arguments."""
    det = TailEnsemble(warmup=20)
    det._change = HoltWintersResidual(season_buckets=0, warmup=10, alpha=0.5, clip=2.0, reset_after=0)
    det._change_tail = ExceedanceTail(threshold=2.0, run_gap=0, prior_index=0.5, clip=2.0)
    det._stuck = RepeatRun(tolerance=0.05, halflife=100.0, min_reversals=0.1)
    return det


@pytest.mark.parametrize(
    "make",
    [
        lambda: TailEnsemble(warmup=100, z_threshold=2.5),
        lambda: TailEnsemble(
            metric="value", warmup=5, level_halflife=50.0, change_alpha=0.6, tail_index_prior=0.4, max_repeat_rate=0.5
        ),
        lambda: TailEnsemble(warmup=0, z_threshold=1.0),
    ],
    ids=["warmup100-z2.5", "fast", "warmup0"],
)
def test_other_parameters_agree(nab: Readings, make: Callable[[], TailEnsemble]) -> None:
    np.testing.assert_array_equal(kernel.initial_state(kernel.params_vector(make())), kernel.from_reference(make()))
    assert_agree(make, nab, 7)


def test_members_built_otherwise_agree(nab: Readings) -> None:
    assert_agree(custom_members, nab, 7, rebuild=False)


def test_state_hands_over_mid_stream_both_ways(nab: Readings, case: Case) -> None:
    """Reference for the first half, kernel for the second, and back: as if one had run it all."""
    stream, values, t_ms = nab
    half = len(values) // 2
    whole, finished = reference(case.make, nab)
    _, detectors = reference(case.make, (stream[:half], values[:half], t_ms[:half]))
    states, params = fresh_states(case.make, 7, case.kernel)
    for s, det in detectors.items():
        states[s] = case.kernel.from_reference(det)
    second = case.kernel.score_learn(states, stream[half:], values[half:], t_ms[half:], params)
    np.testing.assert_allclose(second, whole[half:], rtol=RTOL, atol=ATOL)
    for s, det in finished.items():
        assert_same_state(states[s], det, case=case)  # and to_reference() rebuilds each as the whole run left it


def test_kernels_refuse_bad_shapes(case: Case) -> None:
    k = case.kernel
    states, params = fresh_states(case.make, 2, k)
    one = np.ones(1)
    before = states.copy()
    with pytest.raises(IndexError):  # checked before the first reading is learned
        k.score_learn(states, np.array([0, 2]), np.ones(2), np.zeros(2, dtype=np.int64), params)
    np.testing.assert_array_equal(states, before)
    with pytest.raises(ValueError):
        k.score_learn(states, np.zeros(2, dtype=np.int64), one, np.zeros(1, dtype=np.int64), params)
    with pytest.raises(ValueError):
        k.score_learn(states[:, :10].copy(), np.zeros(1, dtype=np.int64), one, np.zeros(1, dtype=np.int64), params)
    with pytest.raises(ValueError):
        kernel_for("isolation_forest")


def test_tail_ensemble_refuses_a_seasonal_member() -> None:
    det = TailEnsemble()
    det._level = RobustZScore(season_buckets=24)
    with pytest.raises(ValueError, match="season"):
        kernel.params_vector(det)
