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
    # two banks, each of its kernel's width: the sensor's 3 metrics at 264 KB, the thermostats' at 1,216 B
    assert mixed.engine.state_sizes == [kernel_for("declared_levels").STATE_SIZE, kernel_for("cad_ose").STATE_SIZE]
    table = mixed.store.load_many(["th-0", "th-1", "aq-0"])
    assert [len(rows) for rows in table.detectors] == [4, 3]  # temperature and humidity of each thermostat
    restored = DeviceTable.from_bytes(table.to_bytes(), mixed.engine.state_sizes)
    for bank in (0, 1):
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
    assert MIXED.detector_of("air_quality") == "cad_ose"
    assert MIXED.detector_of("thermostat") == MIXED.detector_of(None) == "declared_levels"
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
        for d, name, row in zip(table.metric_device, table.metric_name, table.metric_detector, strict=True)
        if row >= 0
    }
    assert declared[("th-0", "temperature_c")] == declared[("th-1", "temperature_c")] == (10.0, 35.0)
    assert all(np.isnan(v[0]) for k, v in declared.items() if k[1] != "temperature_c")
    assert np.isnan(declared[("aq-0", "temperature_c")][0])  # declared for thermostats only
    # the declared metric is judged against the range's levels; the others score as before
    plain = Harness().run([sorted(thermostats + sensor, key=lambda r: r.offset)])
    assert _scores(rows, "aq-") == _scores(plain, "aq-")
