"""The limp-mode policy against what the streaming engine really raises for an overheating
vehicle (the engine run offline on simulated readings, as models/evaluation/simulated.py
does; no brokers needed): its coolant alert is one the default policy answers with limp_mode,
and healthy vehicles raise none."""

from __future__ import annotations

import json
from typing import Any

from models.evaluation.simulated import run_alerts, settings_for, simulate
from responder.policy import DEFAULT_POLICIES


def raised(kinds: tuple[str, ...], rate: float, seed: int) -> list[dict[str, Any]]:
    fleet = simulate(homes=0, vehicles=3, days=0.1, seed=seed, vehicle_interval_s=1.0, anomalies_per_day=rate,
                     kinds=kinds, tick_ms=1000)
    bodies: list[dict[str, Any]] = []
    run_alerts(fleet, settings_for(None), lambda _d, row: bodies.append(json.loads(row["body"]))
               if row["kind"] == "alert" else None)
    return [b for b in bodies if b["state"] == "raised"]


def limp_policies(alert: dict[str, Any]) -> list[str]:
    return [p.name for p in DEFAULT_POLICIES if p.applies_to(alert)]


def test_an_overheating_vehicles_coolant_alert_gets_limp_mode_and_healthy_ones_raise_none() -> None:
    alerts = raised(("overheating",), 20.0, seed=3)
    coolant = [a for a in alerts if a["metric"] == "coolant_temp_c"]
    assert coolant, alerts
    assert all(limp_policies(a) == ["limp-mode-on-overheating"] for a in coolant), coolant
    assert not [a for a in raised(("harsh_braking",), 0.0001, seed=4) if a["metric"] == "coolant_temp_c"]
