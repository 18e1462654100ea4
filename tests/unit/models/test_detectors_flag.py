"""Each detector flags every anomaly kind it claims, and stays quiet on clean data."""

from __future__ import annotations

import numpy as np
import pytest

from iotwatch.models.catalog import detector_class, make, names
from tests.support.streams import clean, with_anomaly

#: Alert levels that mean "anomalous" for each detector on the generated data.
ALERT = {"robust_zscore": 0.5, "tail_ensemble": 0.45, "episode_likelihood": 0.4}
#: Rows after the onset in which the anomaly must be flagged.
HORIZON = {"drift": 1000}

CLAIMS = [(name, kind) for name in names() for kind in sorted(detector_class(name).detects)]


def _scores(name: str, t: np.ndarray, v: np.ndarray) -> np.ndarray:
    return make(name).score_learn_many(v.reshape(-1, 1), t, ["value"])


@pytest.mark.parametrize(("name", "kind"), CLAIMS, ids=[f"{n}-{k}" for n, k in CLAIMS])
def test_flags_claimed_kind(name: str, kind: str) -> None:
    t, v = clean()
    quiet = _scores(name, t, v)[1000:].max()
    t, v, onset = with_anomaly(kind)
    flagged = _scores(name, t, v)[onset : onset + HORIZON.get(kind, 300)].max()
    assert flagged > quiet + 0.005, f"{name} {kind}: {flagged:.3f} vs clean {quiet:.3f}"
    if name in ALERT:
        assert flagged >= ALERT[name]


@pytest.mark.parametrize("name", sorted(ALERT))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quiet_on_clean_seasonal_data(name: str, seed: int) -> None:
    t, v = clean(seed)
    scores = _scores(name, t, v)[1000:]
    assert scores.max() < ALERT.get(name, 0.5)


def test_repeat_run_judges_only_streams_where_runs_are_news() -> None:
    """A noisy sensor stuck at one value is flagged; a smooth signal holding still at its
    daily peak, a battery level and a meter idling at zero are not."""
    from iotwatch.models.repeat_run import RepeatRun

    rng = np.random.default_rng(3)
    i = np.arange(6000)
    streams = {
        "smooth": np.round(20 + 5 * np.sin(2 * np.pi * i / 2880), 2),  # 30 s readings, no noise
        "battery": np.round(np.linspace(90, 89, len(i)), 1),
        "idle meter": np.where((i // 500) % 2 == 0, 0.0, np.round(300 + rng.normal(0, 20, len(i)), 1)),
    }
    for name, values in streams.items():
        det = RepeatRun()
        assert max(det.score_learn_one({"v": float(v)}, k) for k, v in enumerate(values)) == 0.0, name
    noisy = np.round(20 + rng.normal(0, 0.2, len(i)), 2)
    noisy[5000:5010] = noisy[5000]
    det = RepeatRun()
    scores = [det.score_learn_one({"v": float(v)}, k) for k, v in enumerate(noisy)]
    assert max(scores[:5000]) < 0.45 < max(scores[5000:5010])
