"""declared_levels: episode_likelihood on a metric without a declared range, and the levels
of the range when one is declared (NAB's protocol, or an operator's normal range)."""

from __future__ import annotations

import numpy as np

from iotwatch.evaluation.labelled_streams import declare_nab
from iotwatch.evaluation.sources import NAB_SAMPLE, NabSource
from iotwatch.models.catalog import make
from iotwatch.models.kernels import declared_levels as kernel
from iotwatch.models.kernels import episode_likelihood

T0 = 1_700_000_000_000


def _quiet(n: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.round(20.0 + 2.0 * np.sin(np.arange(n) / 40.0) + rng.normal(0.0, 0.2, n), 2)


def _feed(det, values: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.array([det.score_learn_one({"m": v}, T0 + i * 60_000) for i, v in enumerate(values.tolist())])


def test_without_a_declared_range_it_is_episode_likelihood_reading_by_reading() -> None:
    stream = next(s for s in NabSource(NAB_SAMPLE).streams() if s.key == "realTraffic/occupancy_6005.csv")
    ours, theirs = make("declared_levels"), make("episode_likelihood")
    for v, t in zip(stream.values[:, 0].tolist(), stream.t_ms.tolist(), strict=True):
        assert ours.surprise_one({"m": v}, t) == theirs.surprise_one({"m": v}, t)
        assert ours.score_learn_one({"m": v}, t) == theirs.score_learn_one({"m": v}, t)
    np.testing.assert_array_equal(ours._states[0, : episode_likelihood.STATE_SIZE], theirs._states[0])
    assert np.isnan(ours._states[0, kernel.LOW])


def test_a_reading_at_a_level_never_visited_alarms_once_after_the_probation() -> None:
    values = _quiet(3000)
    values[2500] = 95.0  # inside the declared range, far above every level visited
    scores = _feed(make("declared_levels").declare(0.0, 100.0, 500), values)
    assert scores[2500] > 0.5 and scores[:2500].max() < 0.1
    assert scores[2502:].max() == 0.0  # the episode alarms at its start and its end, then holds
    early = values.copy()
    early[300] = 95.0  # within the probation: learned, not judged
    assert _feed(make("declared_levels").declare(0.0, 100.0, 500), early)[:500].max() == 0.0
    live = _feed(make("declared_levels"), values)
    assert live[2500] > 0.6  # episode_likelihood: a narrower margin over the quiet readings
    assert live[2500] - live[:2500].max() < scores[2500] - scores[:2500].max()


def test_the_state_row_is_bounded_and_restores_with_its_declared_range() -> None:
    det = make("declared_levels").declare(0.0, 100.0, 100)
    _feed(det, _quiet(400))
    payload = det.dumps()
    assert len(payload) < 4096 and det.state_limit_bytes() <= 4096
    assert kernel.STATE_SIZE * 8 == 1216
    again = make("declared_levels").set_state(det.to_state())
    follow = _quiet(50, seed=4)
    np.testing.assert_array_equal(_feed(again, follow), _feed(det, follow))


def test_a_declared_range_must_have_two_finite_ends_in_order() -> None:
    for low, high in ((None, 1.0), (1.0, 1.0), (2.0, 1.0), (float("nan"), 1.0)):
        det = make("declared_levels").declare(low, high, None)
        assert np.isnan(det._states[0, kernel.LOW])
    # NAB's protocol on a constant stream declares no range: it runs as episode_likelihood
    flat = np.full(200, 5.0)
    det = declare_nab(make("declared_levels"), flat)
    np.testing.assert_array_equal(_feed(det, flat), _feed(make("episode_likelihood"), flat))
