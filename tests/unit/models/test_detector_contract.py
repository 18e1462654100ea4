"""The contract every registered detector keeps; adding a detector adds it here."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest

from iotwatch.models.base import ANOMALY_KINDS, Detector
from iotwatch.models.catalog import DETECTORS, detector_class, load, names
from iotwatch.models.catalog import make as _catalog_make
from tests.support.streams import clean

T0 = 1_700_000_000_000
#: Lighter settings where the defaults only cost time (scikit-learn scores row by row here).
LIGHT = {"isolation_forest": {"n_estimators": 20, "min_train": 200, "refit_every": 300}}


def make(name: str) -> Detector:
    return _catalog_make(name, **LIGHT.get(name, {}))


def _key(det: Detector) -> str:
    return getattr(det, "metric", None) or "value"


def _feed(det: Detector, values: np.ndarray, t0: int = T0, step: int = 60_000) -> list[float]:
    key = _key(det)
    return [det.score_learn_one({key: float(v)}, t0 + i * step) for i, v in enumerate(values)]


@pytest.fixture(params=names())
def name(request: pytest.FixtureRequest) -> str:
    return request.param


def test_docstring_and_claims(name: str) -> None:
    cls = detector_class(name)
    assert (cls.__doc__ or "").strip()
    assert cls.detects <= ANOMALY_KINDS


def test_scores_in_unit_interval(name: str) -> None:
    _, values = clean(seed=3, n=1500)
    rng = np.random.default_rng(3)
    values = values.copy()
    values[rng.integers(0, len(values), 20)] *= 50
    scores = _feed(make(name), values)
    assert all(0.0 <= s <= 1.0 and not math.isnan(s) for s in scores)


def test_each_detector_is_registered_under_its_own_name(name: str) -> None:
    """A payload names its detector: that name must resolve back to the class (one registry)."""
    assert detector_class(name).name == name and name in DETECTORS


def test_round_trip_gives_identical_scores(name: str) -> None:
    _, values = clean(seed=5, n=1200)
    det = make(name)
    _feed(det, values[:700])
    copy = load(det.dumps())
    assert type(copy) is type(det)
    rest = values[700:]
    assert _feed(copy, rest, T0 + 700 * 60_000) == _feed(det, rest, T0 + 700 * 60_000)


#: Detectors whose state is a capped memory rather than a few numbers, and their limit at
#: the default parameters.
_STATE_LIMITS = {"cad_ose": 860_000}


def test_compact_state_is_small_json(name: str) -> None:
    det = make(name)
    if not det.compact_state:
        with pytest.raises(NotImplementedError):
            det.to_state()
        return
    _, values = clean(seed=6, n=800)
    _feed(det, values[:500])
    state = json.loads(json.dumps(det.to_state(), allow_nan=False))
    assert len(json.dumps(state)) < det.state_limit_bytes() <= _STATE_LIMITS.get(name, 4096)
    restored = make(name).set_state(state)  # a fresh detector with the same params
    assert _feed(restored, values[500:]) == _feed(det, values[500:])


def test_seeded_determinism(name: str) -> None:
    _, values = clean(seed=7, n=1000)
    assert _feed(make(name), values) == _feed(make(name), values)


def test_clone_is_untrained(name: str) -> None:
    _, values = clean(seed=8, n=600)
    det = make(name)
    _feed(det, values)
    assert _feed(det.clone(), values) == _feed(make(name), values)


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(np.full(700, 3.0), id="constant"),
        pytest.param(np.array([1e300, -1e300, 1e308, 0.0, 5.0] * 100), id="huge"),
        pytest.param(np.array([42.0]), id="single"),
    ],
)
def test_no_crash_on_edge_input(name: str, values: np.ndarray) -> None:
    scores = _feed(make(name), values)
    assert all(0.0 <= s <= 1.0 for s in scores)


def test_missing_and_non_finite_metrics(name: str) -> None:
    det = make(name)
    for i, reading in enumerate([{}, {"value": float("nan")}, {"value": float("inf")}, {"other": 1.0}]):
        assert 0.0 <= det.score_learn_one(reading, T0 + i) <= 1.0


def test_batch_equals_loop(name: str) -> None:
    t, values = clean(seed=9, n=1200)
    det = make(name)
    key = _key(det)
    looped = make(name)
    expected = [looped.score_learn_one({key: float(v)}, int(ts)) for ts, v in zip(t, values, strict=True)]
    batch = det.score_learn_many(values.reshape(-1, 1), t, [key])
    np.testing.assert_allclose(batch, expected, rtol=0, atol=1e-12)


def test_declared_warm_up_is_when_scores_start(name: str) -> None:
    """``warmup_readings()`` (what score-csv warns about) is when a detector starts scoring:
    nothing above 0 before it, and a spike just after it is scored."""
    det = _catalog_make(name)
    warmup = det.warmup_readings()
    rng = np.random.default_rng(3)
    values = rng.normal(10.0, 1.0, warmup + 80)
    values[warmup + 30] = 60.0
    scores = np.nan_to_num(np.array(_feed(det, values)))
    assert not np.any(scores[:warmup] > 0), np.flatnonzero(scores[:warmup] > 0)[:5]
    if np.any(scores > 0):
        assert scores[warmup + 30] > 0


def test_a_fleet_model_pickled_under_the_stages_former_top_level_names_loads() -> None:
    """A registry written when the stages installed as top-level packages names them so in
    its pickles (``models.iforest``): such a payload loads and scores as the model did."""
    _, values = clean(seed=5, n=600)
    det = make("isolation_forest")
    _feed(det, values[:500])
    payload = pickle.dumps(det, protocol=2)  # protocol 2 names each class as text: `c<module>\n<name>\n`
    former = payload.replace(b"\nciotwatch.models.", b"\ncmodels.").replace(b"ciotwatch.models.", b"cmodels.")
    assert b"iotwatch.models" not in former and b"cmodels.iforest" in former
    copy = load(former)
    rest = values[500:]
    assert _feed(copy, rest, T0 + 500 * 60_000) == _feed(det, rest, T0 + 500 * 60_000)
