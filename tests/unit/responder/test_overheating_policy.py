"""The limp-mode policy against what the streaming engine really raises for an overheating
vehicle (the engine run offline on simulated readings, as evaluation/simulated.py
does; no brokers needed): the coolant passing the catalogue's danger limit raises
``coolant_overheating``, which the default policy answers with limp_mode, before the sensor
saturates; the detector's own coolant alerts send nothing, and healthy vehicles raise none."""

from __future__ import annotations

from iotwatch.contract.alerts import AlertRecord, decode_alert
from iotwatch.evaluation.simulated import run_alerts, settings_for, simulate
from iotwatch.responder.policy import DEFAULT_POLICIES, OVERHEAT_C


def raised(kinds: tuple[str, ...], rate: float, seed: int) -> list[AlertRecord]:
    fleet = simulate(
        homes=0,
        vehicles=3,
        days=0.1,
        seed=seed,
        vehicle_interval_s=1.0,
        anomalies_per_day=rate,
        kinds=kinds,
        tick_ms=1000,
    )
    bodies: list[AlertRecord] = []
    run_alerts(
        fleet,
        settings_for(None),
        lambda _d, row: bodies.append(decode_alert(row["body"].encode())) if row["kind"] == "alert" else None,
    )
    return [b for b in bodies if b.raised]


def limp_policies(alert: AlertRecord) -> list[str]:
    return [p.name for p in DEFAULT_POLICIES if p.applies_to(alert)]


def test_an_overheating_vehicle_raises_coolant_overheating_and_gets_limp_mode_and_healthy_ones_raise_none() -> None:
    alerts = raised(("overheating",), 20.0, seed=3)
    hot = [a for a in alerts if a.rule == "coolant_overheating"]
    assert hot, alerts
    assert all(limp_policies(a) == ["limp-mode-on-overheating"] for a in hot), hot
    # raised where it gets dangerous (105 C), far below the sensor's 130 C ceiling
    assert all(OVERHEAT_C <= a.value < 115.0 and a.severity == "critical" for a in hot), hot
    assert all(a.runbook_url.endswith("#coolant_overheating") for a in hot)
    # raised on a vehicle's reading, so they say where it was (an emergency notice needs it)
    assert all(set(a.location) == {"lat_deg", "lon_deg"} for a in hot), hot
    assert not [a for a in alerts if a.rule != "coolant_overheating" and limp_policies(a)]
    assert not [a for a in raised(("harsh_braking",), 0.0001, seed=4) if a.rule == "coolant_overheating"]
