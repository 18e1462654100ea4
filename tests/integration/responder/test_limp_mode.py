"""The vehicle side of the closed loop against the real broker and MQTT: an overheating
engine's coolant alert sends ``limp_mode``; the simulated vehicle caps its speed, its coolant
recovers, the ground truth says the command ended the anomaly and the twin reports limp mode.
A crash alert writes one emergency notification record (also when it cleared before the
responder saw it firing), and no second one after a responder restart."""

from __future__ import annotations

import time
from pathlib import Path

from iotwatch.contract.oncall import CommandAudit, Emergency, decode
from iotwatch.devices.vehicle import LIMP_KMH, OVERHEATING
from iotwatch.responder.policy import DEFAULT_POLICIES, OVERHEAT_C
from iotwatch.responder.service import Responder
from iotwatch.responder.twin_ops import read_twin
from iotwatch.settings import Settings
from tests.helpers import InThread, read_topic, wait_for
from tests.support.alerts import changed, make_alert, produce
from tests.support.clock import next_rounds
from tests.support.homes import VEHICLE, VEHICLE_SITE, Obeying, home_with_faults, mode


def vehicle_state(sim: object) -> tuple[float, float]:
    """(coolant degC, speed km/h) of the simulated vehicle."""
    group = next(g for g in sim.groups if g.device_type == "vehicle_edr")  # type: ignore[attr-defined]
    return float(group.coolant[0]), float(group.speed[0] * 3.6)


def test_overheating_vehicle_goes_limp_and_recovers_and_a_crash_is_an_emergency(
    test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    settings = test_settings.model_copy(
        update={"respond": test_settings.respond.model_copy(update={"client_id": f"responder-{unique}"})}
    )
    sim = home_with_faults(tmp_path, vehicle_overheats=True, ticks=3600)  # 6 min: the engine is hot
    coolant, _ = vehicle_state(sim)
    assert coolant > OVERHEAT_C and mode(sim, VEHICLE) == OVERHEATING
    start = int(time.time() * 1000) - 10_000
    hot = make_alert(
        VEHICLE,
        "vehicle_edr",
        VEHICLE_SITE,
        "coolant_overheating",
        "critical",
        "raised",
        start,
        metric="coolant_temp_c",
        value=round(coolant, 1),
    )
    cold = make_alert(
        VEHICLE,
        "vehicle_edr",
        VEHICLE_SITE,
        "anomaly_score",
        "warning",
        "raised",
        start - 5000,
        metric="coolant_temp_c",
        value=60.0,
    )  # unusual, but not the danger rule: no command
    crash = make_alert(
        VEHICLE,
        "vehicle_edr",
        VEHICLE_SITE,
        "crash",
        "critical",
        "raised",
        start + 1000,
        metric="accel_x_g",
        value=-9.5,
        lat_deg=52.52,
        lon_deg=13.4,
    )
    # the crash alert clears within the batch that raised it: the responder never sees it firing
    crash_cleared = changed(crash, state="cleared", detected_at_ms=crash.detected_at_ms + 1)
    produce(settings.kafka, settings.topics.alerts, [hot, cold, crash, crash_cleared])

    devices = Obeying(sim, settings.mqtt, f"sim-{unique}")
    running = InThread(lambda stop: Responder(settings, DEFAULT_POLICIES, stop))
    try:
        wait_for(lambda: mode(sim, VEHICLE) == 0, 30, "limp mode ended the overheating")
        wait_for(lambda: vehicle_state(sim)[0] < OVERHEAT_C - 3, 60, "the coolant recovered")
        speeds = []
        for _ in range(20):
            speeds.append(vehicle_state(sim)[1])
            time.sleep(0.1)
        assert max(speeds) <= LIMP_KMH + 2.0  # capped (a cruise control's overshoot)
        wait_for(
            lambda: (
                (twin := read_twin(settings, VEHICLE)).reported is not None
                and twin.reported.properties.limp_mode is True
            ),
            30,
            "the twin reports limp mode",
        )
    finally:
        counts = running.close()
        devices.close()
    audits = [decode(m.value(), CommandAudit) for m in read_topic(settings.kafka, settings.topics.commands, idle_s=1)]
    limp = [a for a in audits if a.alert_id == hot.alert_id]
    assert {a.name for a in limp} == {"limp_mode"} and limp[-1].status.value == "done"
    assert not [a for a in audits if a.alert_id in (cold.alert_id, crash.alert_id)]  # no command for those
    truth = [r for r in sim.injector.records if r.kind == "overheating"]
    assert truth and truth[0].ended_by_command == limp[-1].command_id
    assert counts["emergencies"] == 1

    again = InThread(lambda stop: Responder(settings, DEFAULT_POLICIES, stop))  # rebuilds from the topics
    next_rounds(again.service)  # it has acted on all it rebuilt
    assert not again.close().get("emergencies")
    notices = [decode(m.value(), Emergency) for m in read_topic(settings.kafka, settings.topics.emergencies, idle_s=1)]
    assert [(n.alert_id, n.device_id, n.policy) for n in notices] == [(crash.alert_id, VEHICLE, "emergency-on-crash")]
    assert notices[0].location == {"lat_deg": 52.52, "lon_deg": 13.4} and "crash" in notices[0].message
