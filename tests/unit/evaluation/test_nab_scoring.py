"""NAB scoring reproduces the benchmark's rules on small hand-checked cases."""

from __future__ import annotations

import numpy as np
import pytest

from iotwatch.evaluation.nab_scoring import (
    PROFILES,
    normalised,
    optimise_threshold,
    probationary_length,
    scaled_sigmoid,
    scores_by_threshold,
    sweep_stream,
)

STD = PROFILES["standard"]
N = 1000
WINDOW = (600, 699)


def _score(scores: np.ndarray, windows: list[tuple[int, int]] = [WINDOW]) -> tuple[float, float | None]:  # noqa: B006
    stream = sweep_stream("s", scores, windows, STD)
    threshold, raw = optimise_threshold([stream], STD)
    return threshold, normalised(raw, stream.n_windows, STD)


def test_probation_and_sigmoid() -> None:
    assert probationary_length(1000) == 150
    assert probationary_length(100_000) == 750
    assert scaled_sigmoid(-1.0) == pytest.approx(0.98661, abs=1e-5)
    assert scaled_sigmoid(5.0) == -1.0


def test_null_detector_scores_zero_and_perfect_scores_100() -> None:
    assert _score(np.zeros(N))[1] == pytest.approx(0.0)
    perfect = np.zeros(N)
    perfect[WINDOW[0]] = 1.0
    assert _score(perfect)[1] == pytest.approx(100.0)


def test_earlier_detection_scores_higher() -> None:
    results = []
    for at in (600, 650, 690):
        scores = np.zeros(N)
        scores[at] = 1.0
        results.append(_score(scores)[1])
    assert results[0] > results[1] > results[2] > 0


def test_false_positive_costs_a_fp_weight() -> None:
    scores = np.zeros(N)
    scores[WINDOW[0]] = 1.0
    scores[300] = 1.0  # before any window: -0.11
    stream = sweep_stream("s", scores, [WINDOW], STD)
    table = dict(scores_by_threshold([stream], STD))
    assert table[1.0] == pytest.approx(1.0 - 0.11)
    assert table[1.1] == pytest.approx(-1.0)


def test_detections_in_probation_are_ignored() -> None:
    scores = np.zeros(N)
    scores[10] = 1.0
    assert _score(scores)[1] == pytest.approx(0.0)


def test_threshold_is_optimised_over_distinct_scores() -> None:
    scores = np.full(N, 0.1)
    scores[WINDOW[0] + 10] = 0.9
    scores[200:220] = 0.5  # a burst of false positives below the true detection
    threshold, score = _score(scores)
    assert threshold == 0.9
    assert 90 < score < 100
