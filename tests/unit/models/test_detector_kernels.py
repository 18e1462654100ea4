"""Each per-reading detector with a kernel (:data:`iotwatch.models.catalog.KERNELS`) is that
kernel: its class calls the compiled step on a batch of one reading. These tests hold the
scores to values pinned on the shipped NAB sample (``fixtures/<name>_nab.npz``: every
reading's score, and surprise where a hold lowers the score, of three NAB streams; their
README says how they were made), hold a run with numba's JIT disabled (the same code as
plain Python, for reading and debugging) to the compiled run, and check what the batch
adds to the one-reading path: interleaved streams, uneven micro-batches, state that moves
between the two."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from iotwatch.evaluation.labelled_streams import declare_nab
from iotwatch.evaluation.sources import NAB_SAMPLE, NabSource
from iotwatch.models.base import Detector
from iotwatch.models.cad_ose import nab_scores
from iotwatch.models.catalog import KERNELS, kernel_for, load, make
from iotwatch.models.kernels import KernelDetector
from iotwatch.models.kernels.cad_ose import given_range_scores, params_vector

FIXTURES = Path(__file__).parent / "fixtures"
#: Detectors whose class wraps their kernel.
WRAPPED = ["cad_ose", "declared_levels", "episode_likelihood", "tail_ensemble"]
#: The stream the pure-Python run reads (the shortest of the sample), and how many readings.
PLAIN_KEY, PLAIN_READINGS = "realTraffic/speed_7578.csv", 700

STREAMS = {s.key: s for s in NabSource(NAB_SAMPLE).streams()}


def pinned(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / f"{name}_nab.npz") as data:
        return {key: data[key] for key in data.files}


def feed(det: Detector, values: np.ndarray, t_ms: np.ndarray, surprises: list[float] | None = None) -> np.ndarray:
    """Score-learn each reading through the detector's class, one call a reading."""
    scores = []
    for v, t in zip(values.tolist(), t_ms.tolist(), strict=True):
        if surprises is not None:
            surprises.append(det.surprise_one({"m": v}, int(t)))
        scores.append(det.score_learn_one({"m": v}, int(t)))
    return np.array(scores)


@pytest.fixture(params=WRAPPED)
def name(request: pytest.FixtureRequest) -> str:
    return request.param


def test_every_kernel_is_its_detector() -> None:
    assert sorted(KERNELS) == sorted(WRAPPED)
    for name in WRAPPED:
        det = make(name)
        assert isinstance(det, KernelDetector) and det._kernel is kernel_for(name)
        assert len(det.to_state()["row"]) == kernel_for(name).STATE_SIZE


def test_scores_equal_the_pinned_ones(name: str) -> None:
    fixture = pinned(name)
    keys = sorted({k.split(":")[0] for k in fixture})
    assert len(keys) == 3 and sum(len(STREAMS[k]) for k in keys) > 7000
    for key in keys:
        stream = STREAMS[key]
        surprises: list[float] = []
        scores = feed(make(name), stream.values[:, 0], stream.t_ms, surprises)
        np.testing.assert_array_equal(scores, fixture[f"{key}:score"], err_msg=key)
        if f"{key}:nab_scores" in fixture:  # NAB's run of CAD OSE: the range given, no cap
            np.testing.assert_array_equal(nab_scores(stream.values[:, 0]), fixture[f"{key}:nab_scores"], err_msg=key)
        if f"{key}:surprise" in fixture:
            np.testing.assert_array_equal(np.array(surprises), fixture[f"{key}:surprise"], err_msg=key)
        assert scores.max() > 0.0
        if f"{key}:nab_protocol_score" in fixture:  # the range and probation declared, as NAB does
            surprises = []
            declared = feed(declare_nab(make(name), stream.values[:, 0]), stream.values[:, 0], stream.t_ms, surprises)
            np.testing.assert_array_equal(declared, fixture[f"{key}:nab_protocol_score"], err_msg=key)
            np.testing.assert_array_equal(np.array(surprises), fixture[f"{key}:nab_protocol_surprise"], err_msg=key)


#: The parameters of ``fixtures/<name>_params_nab.npz`` (pinned like the defaults', on two streams).
PARAMETERS: dict[str, dict[str, dict[str, Any]]] = {
    "episode_likelihood": {
        "counted-in-readings": {
            "warmup": 200,
            "range_s": 0.0,
            "histogram_halflife_s": 0.0,
            "recent_halflife_s": 0.0,
            "histogram_weight": 1.0,
            "trend_weight": 1.0,
            "max_repeat_rate": 0.05,
        },
        "fast": {
            "metric": "value",
            "warmup": 0,
            "range_readings": 10,
            "histogram_warmup": 0,
            "short_alpha": 0.5,
            "min_variance": 1e-6,
            "hold_halflife": 5.0,
            "clip": 10.0,
            "recent_halflife": 3.0,
            "margin": 0.0,
            "instant_weight": 1.0,
            "max_repeat_rate": 1.0,
        },
    },
    "tail_ensemble": {
        "warmup100-z2.5": {"warmup": 100, "z_threshold": 2.5},
        "fast": {
            "metric": "value",
            "warmup": 5,
            "level_halflife": 50.0,
            "change_alpha": 0.6,
            "tail_index_prior": 0.4,
            "max_repeat_rate": 0.5,
        },
        "warmup0": {"warmup": 0, "z_threshold": 1.0},
    },
    # the range fixed by the first 150 readings, as NAB's run never widens it
    "cad_ose": {"fixed-range": {"range_readings": 150, "margin": 0.0, "rest_period": 150, "widen_range": False}},
    # the members' arithmetic is the kernels' (primitives.zscore_learn, repeat_learn)
    "robust_zscore": {"default": {}, "no-season": {"season_buckets": 0, "warmup": 10}},
    "repeat_run": {
        "default": {},
        "tolerant": {"tolerance": 0.5, "halflife": 100.0, "min_reversals": 0.1, "max_repeat_rate": 0.6},
    },
}
CASES = [(name, label) for name, sets in PARAMETERS.items() for label in sets]


@pytest.mark.parametrize(("name", "label"), CASES, ids=[f"{n}-{label}" for n, label in CASES])
def test_other_parameters_equal_the_pinned_scores(name: str, label: str) -> None:
    params = PARAMETERS[name][label]
    fixture = pinned(f"{name}_params")
    keys = sorted({k.split("|")[1].split(":")[0] for k in fixture if k.startswith(f"{label}|")})
    assert len(keys) == 2
    for key in keys:
        det = make(name, **params)
        metric = params.get("metric") or "m"
        surprises, scores = [], []
        for v, t in zip(STREAMS[key].values[:, 0].tolist(), STREAMS[key].t_ms.tolist(), strict=True):
            surprises.append(det.surprise_one({metric: v}, t))
            scores.append(det.score_learn_one({metric: v}, t))
        np.testing.assert_array_equal(scores, fixture[f"{label}|{key}:score"], err_msg=key)
        # a detector without a hold: its surprise is its score (not stored apart)
        expected = fixture.get(f"{label}|{key}:surprise", fixture[f"{label}|{key}:score"])
        np.testing.assert_array_equal(surprises, expected, err_msg=key)
        assert max(scores) > 0.0


def test_cad_ose_widens_its_range_and_starts_its_memory_again_at_a_reading_beyond_it() -> None:
    """The streaming ``cad_ose`` is NAB's run of CAD OSE over one range at a time: from the
    first ``range_readings`` readings' range until a reading beyond it (with the margin),
    which scores 1 and starts a fresh memory over the range widened to take it in."""
    stream = STREAMS["artificialWithAnomaly/art_daily_jumpsup.csv"]
    values = stream.values[:, 0]
    det = make("cad_ose")
    scores = feed(det, values, stream.t_ms)

    params = params_vector(det)
    first, margin = det.range_readings, det.margin
    low, high = float(values[:first].min()), float(values[:first].max())
    expected, widened, start = np.zeros(len(values)), [], first
    while start < len(values):
        span, checked = high - low, start + 1 if widened else start  # a widening reading is inside
        remaining = values[checked:]
        outside = np.flatnonzero((remaining < low - margin * span) | (remaining > high + margin * span))
        end = len(values) if len(outside) == 0 else checked + int(outside[0])
        expected[start:end], _ = given_range_scores(values[start:end], low, high, params, det.max_contexts)
        if widened:
            expected[start] = 1.0
        if end < len(values):
            widened.append(end)
            low, high = min(low, float(values[end])), max(high, float(values[end]))
        start = end
    assert len(widened) >= 2  # the stream's jumps go beyond the range of its first readings
    np.testing.assert_array_equal(scores, expected)


_PLAIN_RUN = """
import json, sys
import numpy as np
from iotwatch.evaluation.labelled_streams import declare_nab
from iotwatch.evaluation.sources import NAB_SAMPLE, NabSource
from iotwatch.models.catalog import make
name, key, n, protocol = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
stream = next(s for s in NabSource(NAB_SAMPLE).streams() if s.key == key)
det = make(name)
if protocol == "nab":
    declare_nab(det, stream.values[:, 0])
scores = [det.score_learn_one({"m": v}, t) for v, t in zip(stream.values[:n, 0].tolist(), stream.t_ms[:n].tolist())]
print(json.dumps({"jit": not __import__("numba").config.DISABLE_JIT, "scores": [repr(s) for s in scores]}))
"""


def test_plain_python_run_equals_the_compiled_one(name: str) -> None:
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    # the declared-range path where the detector has one (NAB's protocol), else the live one
    protocol = "nab" if f"{PLAIN_KEY}:nab_protocol_score" in pinned(name) else "live"
    out = subprocess.run(
        [sys.executable, "-c", _PLAIN_RUN, name, PLAIN_KEY, str(PLAIN_READINGS), protocol],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["jit"] is False
    plain = np.array([float(s) for s in result["scores"]])
    compiled = pinned(name)[f"{PLAIN_KEY}:{'nab_protocol_score' if protocol == 'nab' else 'score'}"][:PLAIN_READINGS]
    assert compiled.max() > 0.0
    np.testing.assert_array_equal(plain, compiled)


def test_one_batch_of_interleaved_streams_equals_a_detector_per_stream(name: str) -> None:
    """The streaming engine's call (all streams' readings in one batch, one row each) gives
    each stream the scores its own detector gives it reading by reading."""
    keys = sorted(STREAMS)[:4]
    rng = np.random.default_rng(3)
    stream = rng.permutation(np.repeat(np.arange(len(keys)), [min(len(STREAMS[k]), 1500) for k in keys]))
    values, t_ms = np.empty(len(stream)), np.empty(len(stream), dtype=np.int64)
    expected = np.empty(len(stream))
    for s, key in enumerate(keys):
        at = np.flatnonzero(stream == s)
        values[at], t_ms[at] = STREAMS[key].values[: len(at), 0], STREAMS[key].t_ms[: len(at)]
        expected[at] = feed(make(name), values[at], t_ms[at])
    kernel = kernel_for(name)
    params = kernel.params_vector(make(name))
    states = np.tile(kernel.initial_state(params), (len(keys), 1))
    whole = kernel.score_learn(states, stream.astype(np.int64), values, t_ms, params)
    np.testing.assert_array_equal(whole, expected)
    # uneven micro-batches (an empty one, one of one reading) give the same
    states_parts = np.tile(kernel.initial_state(params), (len(keys), 1))
    cuts = np.sort(np.concatenate([rng.integers(0, len(stream), 30), [0, 0, 1]]))
    bounds = np.concatenate([[0], cuts, [len(stream)]])
    parts = [
        kernel.score_learn(states_parts, stream[lo:hi].astype(np.int64), values[lo:hi], t_ms[lo:hi], params)
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    np.testing.assert_array_equal(states_parts, states)


def test_state_moves_between_detector_and_batch(name: str) -> None:
    """A detector's saved state continues in the batch kernel and back, as one run."""
    stream = STREAMS["artificialWithAnomaly/art_daily_jumpsup.csv"]
    values, t_ms = stream.values[:, 0], stream.t_ms
    expected = pinned(name)["artificialWithAnomaly/art_daily_jumpsup.csv:score"]
    third = len(values) // 3
    det = make(name)
    first = feed(det, values[:third], t_ms[:third])
    kernel = kernel_for(name)
    params = kernel.params_vector(det)
    states = np.array([[float(v) for v in json.loads(json.dumps(det.to_state(), allow_nan=False))["row"]]])
    zeros = np.zeros(third, dtype=np.int64)
    second = kernel.score_learn(states, zeros, values[third : 2 * third], t_ms[third : 2 * third], params)
    det.set_state({"row": states[0].tolist()})  # the batch's row back into the detector
    back = load(det.dumps())  # and through a registry payload (strict JSON)
    rest = feed(back, values[2 * third :], t_ms[2 * third :])
    np.testing.assert_array_equal(np.concatenate([first, second, rest]), expected)


def test_non_finite_and_extreme_values_score_in_range(name: str) -> None:
    rng = np.random.default_rng(11)
    n = 3000
    noisy = np.round(rng.normal(20.0, 0.3, n), 2)
    noisy[rng.integers(0, n, 120)] = rng.choice([np.nan, np.inf, -np.inf, 1e308, -1e308, 1e100, -0.0], 120)
    giant = rng.choice([1e308, -1e308, 1e-300, 5e99, -5e99, 0.0], n)
    t = 1_763_784_000_000 + np.arange(n, dtype=np.int64) * 1000
    for column in (noisy, giant, np.full(n, np.nan), np.full(n, -1e308)):
        scores = feed(make(name), column, t)
        assert np.isfinite(scores).all() and scores.min() >= 0.0 and scores.max() <= 1.0
        assert (scores[~np.isfinite(column)] == 0.0).all()


def test_kernel_refuses_bad_shapes(name: str) -> None:
    kernel = kernel_for(name)
    params = kernel.params_vector(make(name))
    states = np.tile(kernel.initial_state(params), (2, 1))
    before = states.copy()
    one, zero = np.ones(1), np.zeros(1, dtype=np.int64)
    with pytest.raises(IndexError):  # checked before the first reading is learned
        kernel.score_learn(states, np.array([0, 2]), np.ones(2), np.zeros(2, dtype=np.int64), params)
    np.testing.assert_array_equal(states, before)
    with pytest.raises(ValueError):
        kernel.score_learn(states, np.zeros(2, dtype=np.int64), one, zero, params)
    with pytest.raises(ValueError):
        kernel.score_learn(states[:, :10].copy(), zero, one, zero, params)
