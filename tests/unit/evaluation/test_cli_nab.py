"""score-csv and evaluate over every shipped NAB stream: deterministic, sane output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from iotwatch.application.cli import cli
from iotwatch.evaluation.labelled_streams import declare_nab
from iotwatch.evaluation.sources import NabSource, split_keys
from iotwatch.models.catalog import DEFAULT_DETECTOR, make
from iotwatch.settings import StreamSettings

pytestmark = pytest.mark.slow


def _run(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_evaluate_is_deterministic_and_sane(nab_dir: Path) -> None:
    args = ["evaluate", "--dataset", str(nab_dir), "--detector", "tail_ensemble", "--json"]
    first, second = json.loads(_run(args)), json.loads(_run(args))
    for doc in (first, second):
        doc["detectors"]["tail_ensemble"].pop("seconds")
    assert first == second
    report = first["detectors"]["tail_ensemble"]
    assert first["streams"] == len(NabSource(nab_dir).keys())
    assert set(report["groups"]) == {"artificialNoAnomaly", "artificialWithAnomaly", "realTraffic", "realTweets"}
    overall = report["overall"]
    assert overall["windows"] == first["windows"] > 0
    assert 20.0 < overall["nab_score"] <= 100.0  # far better than the null detector's 0
    assert 0 < overall["detected_windows"] <= overall["windows"]


def test_score_csv_every_stream(nab_dir: Path, tmp_path: Path) -> None:
    for key in NabSource(nab_dir).keys():
        source = nab_dir / "data" / key
        out_a, out_b = tmp_path / "a.csv", tmp_path / "b.csv"
        _run(["score-csv", str(source), str(out_a), "--detector", "tail_ensemble"])
        _run(["score-csv", str(source), str(out_b), "--detector", "tail_ensemble"])
        assert out_a.read_bytes() == out_b.read_bytes()
        scored, original = pd.read_csv(out_a), pd.read_csv(source)
        assert list(scored.columns) == ["timestamp", "value", "anomaly_score"]
        assert scored["timestamp"].tolist() == original["timestamp"].tolist()
        assert scored["anomaly_score"].between(0.0, 1.0).all()


def test_score_csv_default_detector_and_errors(nab_dir: Path, tmp_path: Path) -> None:
    source = nab_dir / "data" / "realTraffic" / "speed_7578.csv"
    out = tmp_path / "out.csv"
    doc = json.loads(_run(["score-csv", str(source), str(out), "--json"]))
    assert doc["rows"] == len(pd.read_csv(source)) and doc["detector"] == DEFAULT_DETECTOR
    bad = tmp_path / "bad.csv"
    bad.write_text("when,what\n1,2\n")
    result = CliRunner().invoke(cli, ["score-csv", str(bad), str(out)])
    assert result.exit_code != 0


def test_score_csv_warns_when_the_stream_is_shorter_than_the_warm_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from iotwatch.evaluation.score_csv_cli import score_file
    from iotwatch.models.catalog import make

    warmup = make(DEFAULT_DETECTOR).warmup_readings()
    rows = warmup - 20
    stamps = pd.date_range("2024-01-01", periods=rows, freq="5min").strftime("%Y-%m-%d %H:%M:%S")
    values = [10.0] * rows
    values[rows - 10] = 500.0  # an obvious spike that the warming detector cannot see
    source = tmp_path / "short.csv"
    pd.DataFrame({"timestamp": stamps, "value": values}).to_csv(source, index=False)
    with caplog.at_level("WARNING"):
        result = score_file(source, tmp_path / "out.csv")
    assert result["warmup_readings"] == warmup and result["max_score"] == 0.0
    assert result["warning"] and f"{rows} rows, fewer than the {warmup} readings" in result["warning"]
    assert [r.getMessage() for r in caplog.records] == [result["warning"]]


def test_score_csv_default_is_the_streaming_jobs_detector_with_its_parameters() -> None:
    """NAB and score-csv must measure what the job runs: same detector, same parameters."""
    stream = StreamSettings()
    job = make(stream.device_detector, **stream.device_detector_params)
    assert DEFAULT_DETECTOR == stream.device_detector
    assert make(DEFAULT_DETECTOR).get_params() == job.get_params()


def test_score_csv_scores_an_out_of_order_row_where_it_stands(nab_dir: Path, tmp_path: Path) -> None:
    original = pd.read_csv(nab_dir / "data" / "realTraffic" / "speed_7578.csv", dtype=str)
    swapped = original.copy()
    swapped.iloc[[500, 501]] = original.iloc[[501, 500]].to_numpy()  # row 501 is stamped before row 500
    source = tmp_path / "swapped.csv"
    swapped.to_csv(source, index=False)
    out_a, out_b = tmp_path / "a.csv", tmp_path / "b.csv"
    result = CliRunner().invoke(cli, ["score-csv", str(source), str(out_a), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["out_of_order"] == 1 and doc["out_of_order_lines"] == [503]  # header line 1, row 501 on line 503
    assert "line(s) 503" in result.stderr
    _run(["score-csv", str(source), str(out_b)])
    assert out_a.read_bytes() == out_b.read_bytes()
    scored = pd.read_csv(out_a, dtype={"timestamp": str, "value": str})
    assert scored["timestamp"].tolist() == swapped["timestamp"].tolist()  # file order kept
    values = swapped["value"].astype(float).to_numpy()
    expected = make(DEFAULT_DETECTOR).score_learn_many(
        values.reshape(-1, 1), np.zeros(len(values), dtype=np.int64), ["value"]
    )
    np.testing.assert_allclose(scored["anomaly_score"], np.round(expected, 6), atol=1e-6)


def test_score_csv_nab_protocol_declares_the_files_range_and_probation(nab_dir: Path, tmp_path: Path) -> None:
    """--nab-protocol tells the detector the file's minimum, maximum and 15 % probation
    before the first row, as NAB's base detector does; without it nothing is declared."""
    source = nab_dir / "data" / "realTraffic" / "speed_7578.csv"
    live, nab = tmp_path / "live.csv", tmp_path / "nab.csv"
    assert json.loads(_run(["score-csv", str(source), str(live), "--json"]))["protocol"] == "live"
    doc = json.loads(_run(["score-csv", str(source), str(nab), "--nab-protocol", "--json"]))
    assert doc["protocol"] == "nab" and doc["detector"] == DEFAULT_DETECTOR
    stream = next(s for s in NabSource(nab_dir).streams() if s.key == "realTraffic/speed_7578.csv")
    expected = declare_nab(make(DEFAULT_DETECTOR), stream.values[:, 0]).score_learn_many(
        stream.values, stream.t_ms, stream.metrics
    )
    np.testing.assert_allclose(pd.read_csv(nab)["anomaly_score"], np.round(expected, 6), atol=1e-6)
    live_scores = make(DEFAULT_DETECTOR).score_learn_many(stream.values, stream.t_ms, stream.metrics)
    np.testing.assert_allclose(pd.read_csv(live)["anomaly_score"], np.round(live_scores, 6), atol=1e-6)
    assert not np.allclose(expected, live_scores)
    # a detector that cannot use a declared range scores the same under both protocols
    for flags in ([], ["--nab-protocol"]):
        _run(["score-csv", str(source), str(tmp_path / f"z{len(flags)}.csv"), "--detector", "robust_zscore", *flags])
    assert (tmp_path / "z0.csv").read_bytes() == (tmp_path / "z1.csv").read_bytes()


def test_evaluate_on_one_half_of_the_split(nab_dir: Path) -> None:
    tuning, held_out = split_keys("tuning"), split_keys("held_out")
    assert not tuning & held_out and len(tuning | held_out) == 28
    doc = json.loads(
        _run(["evaluate", "--dataset", str(nab_dir), "--split", "held_out", "--detector", "robust_zscore", "--json"])
    )
    streams = set(doc["detectors"]["robust_zscore"]["streams"])
    assert doc["split"] == "held_out" and streams and streams <= held_out
    assert streams == held_out & set(NabSource(nab_dir).keys())


def test_evaluate_sets_the_default_beside_the_reproduced_leader_and_the_published_figures(nab_dir: Path) -> None:
    """On nab-dev streams, evaluate reports per half and whole: the job's default detector
    (as evaluated on its own), CAD OSE run as NAB runs it -- at the published corpus
    threshold it gives the published contextOSE figure, to the rounding -- and NAB's
    published figures."""
    doc = json.loads(_run(["evaluate", "--dataset", str(nab_dir), "--detector", DEFAULT_DETECTOR, "--json"]))
    comparison = doc["published_comparison"]
    assert comparison["default"] == DEFAULT_DETECTOR == StreamSettings().device_detector
    parts = comparison["parts"]
    assert set(parts) == {"tuning", "held_out", "whole"}
    assert parts["whole"]["default"]["nab_score"] == round(
        doc["detectors"][DEFAULT_DETECTOR]["overall"]["nab_score"], 1
    )
    nab = json.loads(
        _run(["evaluate", "--dataset", str(nab_dir), "--detector", DEFAULT_DETECTOR, "--protocol", "nab", "--json"])
    )
    assert nab["protocol"] == "nab" and doc["protocol"] == "live"
    whole_nab = parts["whole"]["default_nab_protocol"]["nab_score"]
    assert whole_nab == round(nab["detectors"][DEFAULT_DETECTOR]["overall"]["nab_score"], 1)
    assert whole_nab > parts["whole"]["default"]["nab_score"]  # the declared range is worth something
    for figures in parts.values():
        published = figures["published"]
        assert set(published) == {"ARTime", "numenta", "contextOSE", "knncad", "randomCutForest", "windowedGaussian"}
        assert figures["reproduced_at_published_threshold"]["nab_score"] == published["contextOSE"]
        assert figures["reproduced"]["nab_score"] >= published["contextOSE"]  # its own optimum is no worse
    assert parts["whole"]["streams"] == len(NabSource(nab_dir).keys())
