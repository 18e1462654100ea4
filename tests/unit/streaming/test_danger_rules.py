"""Physically meaningful limits next to the statistics: a metric that drifts into danger
(a vehicle's coolant, a sensor's battery, a room's humidity) raises its catalogue rule when it
crosses the danger limit, long before the sensor saturates, with the lifecycle, ids and runbook
links of every rule; the batched scores equal the per-reading ones."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from iotwatch.contract.detection import Rule
from iotwatch.contract.metric_catalog import DANGER_LIMITS, DEVICE_METRICS, danger_limits
from iotwatch.settings import StreamSettings
from iotwatch.streaming import rules
from iotwatch.streaming.alerting import alert_id
from iotwatch.streaming.episode_book import RULE_ORDER
from tests.unit.streaming.test_engine import T0, Harness, _comparable, alerts_of, record

COOLANT = DANGER_LIMITS["vehicle_edr"]["coolant_temp_c"]


def coolant_drift(n_before: int = 600, n_drift: int = 600, n_after: int = 300, seed: int = 1) -> list:
    """A vehicle read every second: a warm engine at 90 C, then a 10-minute drift to the
    sensor's ceiling (130 C), then back to normal."""
    rng = random.Random(seed)
    ceiling = DEVICE_METRICS["vehicle_edr"]["coolant_temp_c"][2]
    values = [90.0 + rng.gauss(0, 0.3) for _ in range(n_before)]
    values += [90.0 + (ceiling - 90.0) * (i + 1) / n_drift for i in range(n_drift)]
    values += [90.0 + rng.gauss(0, 0.3) for _ in range(n_after)]
    return [
        record(
            i,
            device="car-1",
            device_type="vehicle_edr",
            site="fleet",
            coolant_temp_c=round(v, 1),
            speed_kmh=50.0,
        )
        for i, v in enumerate(values)
    ]


def test_a_coolant_drift_into_danger_raises_coolant_overheating_before_the_sensor_saturates() -> None:
    series = coolant_drift()
    alerts = [a for a in alerts_of(Harness().run([series])) if a.rule == Rule.COOLANT_OVERHEATING]
    assert [a.state for a in alerts] == ["raised", "cleared"]
    raised, cleared = alerts
    first_hot = next(i for i, r in enumerate(series) if _coolant(r) >= COOLANT.warning)
    assert raised.seq == first_hot and raised.first_event_ms == T0 + first_hot * 1000
    assert COOLANT.warning <= raised.value < 106.0  # 105 C, where the ceiling is 130 C
    assert raised.severity == "critical" and raised.metric == "coolant_temp_c"
    assert raised.threshold == COOLANT.warning and "warning limit 105" in raised.message
    assert raised.alert_id == alert_id("car-1", Rule.COOLANT_OVERHEATING, T0 + first_hot * 1000) == cleared.alert_id
    assert raised.runbook_url == StreamSettings().runbook_url(Rule.COOLANT_OVERHEATING)
    assert raised.runbook_url.endswith("#coolant_overheating")
    # open through the critical limit (one alert per episode), cleared once back to normal
    assert cleared.seq >= 1200 and cleared.score == 1.0 and "within its limits" in cleared.message


def _coolant(rec) -> float:
    return json.loads(rec.value)["metrics"]["coolant_temp_c"]


def test_the_danger_rule_does_not_depend_on_how_the_stream_is_cut_into_batches() -> None:
    series = coolant_drift(n_before=200, n_drift=300, n_after=150)
    whole = Harness().run([series])
    cuts = [0, 1, 233, 400, 401, 555, len(series)]
    cut = Harness().run([series[a:b] for a, b in zip(cuts, cuts[1:], strict=False)])
    assert _comparable(whole) == _comparable(cut)
    assert {a.rule for a in alerts_of(whole)} >= {Rule.COOLANT_OVERHEATING}


def test_low_battery_and_humid_air_raise_their_rules_and_normal_devices_raise_none() -> None:
    door = [
        record(i, device="door", device_type="door_sensor", open=0.0, battery_pct=20.0 - 0.05 * i) for i in range(200)
    ]  # 20 % down to 10 %
    humid = [record(i, device="th", humidity_pct=55.0 + 0.1 * i, setpoint_c=21.0, hvac_on=0.0) for i in range(300)]
    raised = {a.rule: a for a in alerts_of(Harness().run([door, humid])) if a.state == "raised"}
    assert raised[Rule.BATTERY_LOW].device_id == "door" and raised[Rule.BATTERY_LOW].value <= 15.0
    assert (
        raised[Rule.BATTERY_LOW].severity == "minor"
        and "below its warning limit 15" in raised[Rule.BATTERY_LOW].message
    )
    assert raised[Rule.HUMIDITY_HIGH].device_id == "th" and raised[Rule.HUMIDITY_HIGH].value >= 70.0
    normal = [record(i, device="door", device_type="door_sensor", open=0.0, battery_pct=80.0) for i in range(50)]
    assert not [a for a in alerts_of(Harness().run([normal])) if a.rule in rules.DANGER_RULES]


def test_the_danger_rules_come_from_the_catalogue_and_keep_the_saved_rule_codes() -> None:
    assert set(rules.DANGER_RULES) == {limit.rule for _, _, limit in danger_limits()}
    # a rule's position is its code in saved episodes: the older rules keep theirs
    assert RULE_ORDER[:8] == (
        Rule.OUT_OF_RANGE,
        Rule.CRASH,
        Rule.HARSH_BRAKING,
        Rule.WATER_LEAK,
        Rule.STUCK_HVAC,
        Rule.ANOMALY_SCORE,
        Rule.DEVICE_SILENT,
        Rule.FLEET_ANOMALY,
    )
    assert set(RULE_ORDER) == set(rules.rule_specs(StreamSettings(), "episode_likelihood"))
    for device_type, metric, limit in danger_limits():
        _, low, high = DEVICE_METRICS[device_type][metric]
        assert (
            low < min(limit.warning, limit.critical) and max(limit.warning, limit.critical) < high
        )  # inside the range
        assert (limit.critical > limit.warning) == limit.above


@pytest.mark.parametrize("value", [4.0, 5.0, 10.0, 15.0, 15.1, 60.0, float("nan")])
def test_batched_danger_scores_equal_the_per_reading_observations(value: float) -> None:
    class Batch:
        device_type = np.array(["door_sensor", "leak_sensor", "thermostat"], dtype=object)
        event = np.array([None, None, None], dtype=object)
        out_of_range = np.zeros(3, dtype=bool)

        def metric(self, name: str) -> np.ndarray:
            return np.full(3, value if name == "battery_pct" else np.nan)

    settings = StreamSettings()
    applies, score = rules.rule_scores(Batch(), settings)[Rule.BATTERY_LOW]
    for i, device_type in enumerate(Batch.device_type):
        metrics = {} if value != value else {"battery_pct": value}
        observed = rules.evaluate(rules.ReadingView(device_type, metrics, None, ()), settings).get(Rule.BATTERY_LOW)
        assert bool(applies[i]) == (observed is not None)
        assert score[i] == (observed.score if observed is not None else 0.0)
