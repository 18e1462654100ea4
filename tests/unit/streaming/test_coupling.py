"""A smart meter's load switching moves power and current together: no alert; a fault in
one register still alerts (streaming/coupling.py)."""

from __future__ import annotations

import random

import numpy as np

from iotwatch.streaming.coupling import explained_entries
from tests.unit.streaming.test_engine import Harness, alerts_of, readings_of, record


def test_explained_only_when_every_moving_metric_is_surprising_and_the_witness_is_not() -> None:
    # readings: 0 load switch, 1 power alone, 2 witness broken too, 3 no witness, 4 a thermostat
    reading_type = np.array(["smart_meter"] * 4 + ["thermostat"], dtype=object)
    entries = [
        (0, "power_w", 0.7),
        (0, "current_a", 0.6),
        (0, "power_factor", 0.1),
        (0, "voltage_v", 0.5),
        (1, "power_w", 0.7),
        (1, "current_a", 0.1),
        (1, "power_factor", 0.1),
        (2, "power_w", 0.7),
        (2, "current_a", 0.6),
        (2, "power_factor", 0.9),
        (3, "power_w", 0.7),
        (3, "current_a", 0.6),
        (4, "power_w", 0.7),
        (4, "current_a", 0.6),
        (4, "power_factor", 0.1),
    ]
    reading = np.array([e[0] for e in entries])
    names = np.array([e[1] for e in entries], dtype=object)
    surprises = np.array([e[2] for e in entries])
    explained = explained_entries(reading_type, reading, names, surprises, moved=0.35, broken=0.4)
    assert [(int(r), n) for r, n, e in zip(reading, names, explained, strict=True) if e] == [
        (0, "power_w"),
        (0, "current_a"),
    ]  # the voltage sag and the witness itself are not explained
    assert not explained_entries(
        reading_type, reading, names, np.full(len(names), np.nan), moved=0.35, broken=0.4
    ).any()  # nothing scored (warming up)


def _meter(events: dict[int, str], n: int = 500, seed: int = 5) -> list:
    """A quiet home at 300 W that an oven (2 kW) switches on at the ``"load"`` readings and
    off 20 readings later; at ``"register"`` readings the power register alone reads 2 kW more."""
    rng = random.Random(seed)
    batch, oven_until = [], -1
    for i in range(n):
        if events.get(i) == "load":
            oven_until = i + 20
        power = 300.0 + (2000.0 if i < oven_until else 0.0)
        power *= 1.0 + 0.01 * rng.gauss(0, 1)
        voltage = 230.0 - power / 2500.0 + rng.gauss(0, 0.4)
        current = power / (voltage * 0.93)
        if events.get(i) == "register":
            power += 2000.0
        batch.append(
            record(
                i,
                device="m",
                device_type="smart_meter",
                power_w=round(power, 1),
                voltage_v=round(voltage, 1),
                current_a=round(current, 3),
            )
        )
    return batch


def test_an_oven_switching_on_and_off_is_a_load_not_an_anomaly() -> None:
    rows = Harness().run([_meter({300: "load", 420: "load"})])
    assert [a.rule for a in alerts_of(rows)] == []
    by_seq = {r["seq"]: r for r in readings_of(rows)}
    # the detectors were surprised (the archive keeps their scores); the alert rule was not
    assert by_seq[300]["scores"]["power_w"] >= 0.4 and by_seq[300]["scores"]["current_a"] >= 0.4


def test_the_power_register_alone_still_alerts_even_after_a_load_switch() -> None:
    """The same jump in power alone breaks the power factor; a few readings after an oven
    switched (power and current may still hold their peak), it is an anomaly all the same."""
    raised = [a for a in alerts_of(Harness().run([_meter({300: "load", 330: "register"})])) if a.state == "raised"]
    assert [(a.rule, a.seq) for a in raised] == [("anomaly_score", 330)]
    assert raised[0].metric in {"power_w", "power_factor"}
