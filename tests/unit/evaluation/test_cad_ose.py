"""CAD OSE reproduces NAB's published ``contextOSE`` results on the shipped NAB sample.

The measure: exact to the published rounding. NAB's results files hold each row's
``anomaly_score`` to six significant digits; every row of every sample stream agrees
within that (relative 1e-5, absolute 1e-6), and so each stream's NAB standard score at
the published corpus threshold equals the published one (to 1e-9).
"""

from __future__ import annotations

import csv

import numpy as np
import pandas as pd
import pytest

from iotwatch.evaluation.nab_scoring import PROFILES, raw_at_threshold, sweep_stream
from iotwatch.evaluation.sources import NAB_PUBLISHED_SCORES, NAB_SAMPLE, NabSource
from iotwatch.models.cad_ose import CadOse, nab_scores
from iotwatch.models.kernels.cad_ose import given_range_scores, params_vector, py2_dict_order, py2_tuple_hash

PUBLISHED = NAB_SAMPLE / "published" / "contextOSE"
STREAMS = {s.key: s for s in NabSource(NAB_SAMPLE).streams()}


def _published_rows(key: str) -> np.ndarray:
    return pd.read_csv(PUBLISHED / key)["anomaly_score"].to_numpy(float)


def _published_score(key: str) -> tuple[float, float]:
    with NAB_PUBLISHED_SCORES.open() as handle:
        for row in csv.DictReader(handle):
            if row["detector"] == "contextOSE" and row["file"] == key:
                return float(row["threshold"]), float(row["score"])
    raise KeyError(key)


def test_every_sample_stream_has_published_rows() -> None:
    assert sorted(p.relative_to(PUBLISHED).as_posix() for p in PUBLISHED.glob("*/*.csv")) == sorted(STREAMS)


@pytest.mark.parametrize("key", sorted(STREAMS))
def test_rows_equal_the_published_ones(key: str) -> None:
    stream = STREAMS[key]
    published = _published_rows(key)
    ours = nab_scores(stream.values[:, 0])
    assert len(ours) == len(published)
    np.testing.assert_allclose(ours, published, rtol=1e-5, atol=1e-6)
    threshold, score = _published_score(key)
    swept = sweep_stream(key, ours, stream.windows, PROFILES["standard"])
    assert raw_at_threshold(swept, threshold, PROFILES["standard"]) == pytest.approx(score, abs=1e-9)


def test_python2_tuple_hash() -> None:
    # CPython 2.7, 64 bits: hash(()), hash((0,)), hash((1, 2)), hash((2147483648, 3))
    assert py2_tuple_hash(()) == 3527539
    assert py2_tuple_hash((0,)) == 3430018387555
    assert py2_tuple_hash((1, 2)) == 3713081631934410656


def test_python2_dict_order_grows_and_wraps() -> None:
    assert py2_dict_order(list(range(6))) == list(range(6))  # the table grew to 32 at the sixth key
    assert py2_dict_order([*range(6), 40]) == [0, 1, 2, 3, 4, 5, 40]  # 40 & 31 == 8
    # slot 1 is taken: 33 probes on to 5 * 1 + 33 + 1 == 39 -> slot 7
    assert py2_dict_order([*range(6), 40, 33]) == [0, 1, 2, 3, 4, 5, 33, 40]
    assert py2_dict_order([9, 1, 17]) == [9, 17, 1]


def test_contexts_stay_within_the_cap() -> None:
    values = STREAMS["realTweets/Twitter_volume_FB.csv"].values[:3000, 0]
    low, high = float(values.min()), float(values.max())
    params = params_vector(CadOse(rest_period=90))
    _, capped = given_range_scores(values, low, high, params, max_contexts=200)
    _, free = given_range_scores(values, low, high, params, max_contexts=None)
    assert capped == 200 < free
