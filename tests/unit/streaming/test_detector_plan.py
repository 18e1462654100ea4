"""A detector per device type: each type's metrics scored by its own detector, with state
rows of that detector's width and the anomaly rule's levels on its scale."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from iotwatch.errors import UserError
from iotwatch.models.catalog import check_kernels, kernel_for
from iotwatch.settings import StreamSettings
from iotwatch.streaming.device_table import DeviceTable
from tests.unit.streaming.test_engine import Harness, Rec, alerts_of, readings_of, record

MIXED = StreamSettings(device_detectors={"air_quality": "cad_ose"})


def _fleet(n: int = 1500, spike_at: int = 1400) -> tuple[list[Rec], list[Rec]]:
    """Two thermostats and an air-quality sensor, noisy; the sensor's CO2 jumps once."""
    rng = random.Random(5)
    thermostats = [
        record(i, device=f"th-{d}", offset=3 * i + d, temperature=21 + rng.gauss(0, 0.2), humidity_pct=40.0)
        for i in range(n)
        for d in (0, 1)
    ]
    sensor = [
        record(
            i,
            device="aq-0",
            device_type="air_quality",
            offset=3 * i + 2,
            co2_ppm=round(600 + 40 * np.sin(i / 9) + rng.gauss(0, 5) + (3000 if i == spike_at else 0), 1),
            pm25_ugm3=round(12 + rng.gauss(0, 1), 2),
            temperature=round(22 + rng.gauss(0, 0.3), 2),
        )
        for i in range(n)
    ]
    return thermostats, sensor


def _scores(rows: list[dict[str, Any]], device_prefix: str) -> list[tuple[str, int, list[tuple[str, float]]]]:
    return sorted(
        (r["device_id"], r["seq"], sorted(r["scores"].items()))
        for r in readings_of(rows)
        if r["device_id"].startswith(device_prefix)
    )


def test_each_device_type_is_scored_by_its_own_detector_as_if_the_job_ran_that_one_alone() -> None:
    thermostats, sensor = _fleet()
    interleaved = sorted(thermostats + sensor, key=lambda r: r.offset)
    mixed = Harness(MIXED)
    rows = [row for lo in range(0, len(interleaved), 250) for row in mixed.process(interleaved[lo : lo + 250])]
    alone_el = Harness().run([thermostats])
    alone_cad = Harness(StreamSettings(device_detector="cad_ose")).run([sensor])
    assert _scores(rows, "th-") and _scores(rows, "th-") == _scores(alone_el, "th-")
    assert _scores(rows, "aq-") and _scores(rows, "aq-") == _scores(alone_cad, "aq-")
    # a bank per kernel, each of its width: the sensor's 3 metrics at 264 KB, the thermostats' 4 in
    # episode_likelihood's 416 B (declared_levels' metrics without a declared range, all here)
    sizes = [kernel_for(d).STATE_SIZE for d in ("declared_levels", "cad_ose", "episode_likelihood")]
    assert mixed.engine.state_sizes == sizes
    table = mixed.store.load_many(["th-0", "th-1", "aq-0"])
    assert [len(rows) for rows in table.detectors] == [0, 3, 4]
    restored = DeviceTable.from_bytes(table.to_bytes(), mixed.engine.state_sizes)
    for bank in (0, 1, 2):
        np.testing.assert_array_equal(restored.detectors[bank], table.detectors[bank])
    assert restored.metric_bank.tolist() == table.metric_bank.tolist()
    with pytest.raises(ValueError, match="the detectors changed"):
        DeviceTable.from_bytes(table.to_bytes(), Harness().engine.state_sizes)


def test_an_anomaly_alert_names_the_detector_that_scored_it_and_uses_its_levels() -> None:
    thermostats, sensor = _fleet()
    rows = Harness(MIXED).run([sorted(thermostats + sensor, key=lambda r: r.offset)])
    raised = [a for a in alerts_of(rows) if a.state == "raised" and a.rule == "anomaly_score"]
    sensor_alerts = [a for a in raised if a.device_id == "aq-0"]
    assert sensor_alerts
    for alert in sensor_alerts:
        assert (alert.detector, alert.fire_score, alert.clear_score) == ("cad_ose", 0.80, 0.73)
        assert alert.model_version == "cad_ose@online" and alert.score >= 0.80
    assert all(a.detector == "declared_levels" and a.fire_score == 0.40 for a in raised if a.device_id != "aq-0")
    sensor_scores = {r["seq"]: r["scores"] for r in readings_of(rows) if r["device_id"] == "aq-0" and r["scores"]}
    # the CO2 spike is beyond every value cad_ose has seen: it widens the range and scores 1
    assert sensor_scores[1400]["co2_ppm"] == 1.0
    # cad_ose's scores between the thermostats' fire level and its own raise nothing
    between = sum(0.40 <= max(scores.values()) < 0.80 for scores in sensor_scores.values())
    assert between > 10
    assert all(max(sensor_scores[a.first_seq].values()) >= 0.80 for a in sensor_alerts)


def test_the_settings_name_each_types_detector_and_its_levels() -> None:
    assert MIXED.alert_scores_of("cad_ose") == (0.80, 0.73)
    assert MIXED.alert_scores_of("declared_levels") == (MIXED.alert_fire_score, MIXED.alert_clear_score)
    assert StreamSettings(detector_params={"cad_ose": {"max_contexts": 256}}).detector_params_of("cad_ose") == {
        "max_contexts": 256
    }
    with pytest.raises(ValidationError, match="clear score must be below"):
        StreamSettings(detector_alert_scores={"cad_ose": (0.5, 0.6)})


def test_a_detector_without_a_kernel_or_with_unknown_parameters_is_refused_in_one_line() -> None:
    check_kernels(["episode_likelihood", "cad_ose"])
    with pytest.raises(UserError, match="have a compiled kernel .* not 'robust_zscore'"):
        check_kernels([*MIXED.device_detectors.values(), "robust_zscore"])
    with pytest.raises(UserError, match="parameters of detector cad_ose .* 'contexts'"):
        Harness(
            StreamSettings(device_detectors={"air_quality": "cad_ose"}, detector_params={"cad_ose": {"contexts": 9}})
        )


def test_a_metric_range_declared_in_the_settings_reaches_its_detector_row() -> None:
    """``stream.metric_ranges`` declares a metric's normal range: a new (device, metric) row of
    a detector that can use one starts with it; other metrics, and other types, have none."""
    from iotwatch.models.kernels import declared_levels

    thermostats, sensor = _fleet(n=200)
    settings = StreamSettings(metric_ranges={"thermostat.temperature_c": (10.0, 35.0)})
    harness = Harness(settings)
    rows = harness.run([sorted(thermostats + sensor, key=lambda r: r.offset)])
    table = harness.store.load_many(["th-0", "th-1", "aq-0"])
    declared = {
        (table.ids[d], name): tuple(table.detectors[0][row, [declared_levels.LOW, declared_levels.HIGH]])
        for d, name, row, bank in zip(
            table.metric_device, table.metric_name, table.metric_detector, table.metric_bank, strict=True
        )
        if row >= 0 and bank == 0
    }
    # only the declared metrics keep declared_levels' rows; the others are in the narrow bank
    assert declared == {("th-0", "temperature_c"): (10.0, 35.0), ("th-1", "temperature_c"): (10.0, 35.0)}
    assert ("aq-0", "temperature_c") not in declared  # declared for thermostats only
    # the declared metric is judged against the range's levels; the others score as before
    plain = Harness().run([sorted(thermostats + sensor, key=lambda r: r.offset)])
    assert _scores(rows, "aq-") == _scores(plain, "aq-")


def test_metrics_without_a_declared_range_keep_episode_likelihood_rows_and_old_wide_rows_score_on() -> None:
    """declared_levels keeps a range's levels only for the metrics ``stream.metric_ranges``
    declares: the others' rows are episode_likelihood's (52 numbers, not 152) and score
    alike. State written when every metric had a 152-number row in bank 0 loads (the narrow
    bank starts empty), and its metrics score on exactly as if nothing had changed."""
    from iotwatch.models.kernels import declared_levels, episode_likelihood

    thermostats, sensor = _fleet(n=400)
    series = sorted(thermostats + sensor, key=lambda r: r.offset)
    settings = StreamSettings(metric_ranges={"thermostat.temperature_c": (10.0, 35.0)})
    harness, restarted = Harness(settings), Harness(settings)
    assert harness.engine.state_sizes == [declared_levels.STATE_SIZE, episode_likelihood.STATE_SIZE]
    first = harness.run([series[:600]])
    wide_initial, rows = harness.engine.plan.banks[0].initial, np.zeros(2, dtype=np.int64)
    for key, (blob,) in harness.store.state.values.items():
        table = DeviceTable.from_bytes(blob, harness.engine.state_sizes)
        narrow = table.metric_bank == 1
        rows += (len(table.detectors[0]), len(table.detectors[1]))
        wide = np.tile(wide_initial, (len(table.detectors[1]), 1))
        wide[:, : episode_likelihood.STATE_SIZE] = table.detectors[1]
        table.metric_detector[narrow] += len(table.detectors[0])
        table.metric_bank[narrow] = 0
        table.detectors = [np.vstack([table.detectors[0], wide])]
        restarted.store.state.values[key] = (table.to_bytes(),)  # the layout of one 152-number bank
    restarted.store.tokens.value = harness.store.tokens.value  # checkpointed with the shards, as in the job
    assert rows.tolist() == [2, 5]  # the two declared metrics in bank 0, the five others in the narrow bank
    rest = harness.run([series[600:]])
    assert _scores(restarted.run([series[600:]]), "") == _scores(rest, "")
    assert _scores(first + rest, "th-") == _scores(Harness(settings).run([series]), "th-")
    plain = Harness(StreamSettings(device_detector="episode_likelihood")).run([series])
    assert _scores(first + rest, "aq-") == _scores(plain, "aq-")
