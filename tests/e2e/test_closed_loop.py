"""The closed loop end to end, every part real: simulated homes (MQTT) -> gateway -> Kafka ->
the streaming job (Spark) raises stuck_hvac and water_leak -> the responder commands the
devices over MQTT -> they acknowledge, obey and recover -> the job clears the alerts."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from iotwatch.clients.kafka import ensure_topics
from iotwatch.contract.detection import Rule
from iotwatch.contract.ground_truth import read_ground_truth
from iotwatch.contract.oncall import CommandAudit, decode
from iotwatch.devices.broker_run import RunOptions, run
from iotwatch.devices.config import SimConfig
from iotwatch.devices.simulation import Simulation
from iotwatch.gateway.bridge import Gateway
from iotwatch.responder.policy import DEFAULT_POLICIES
from iotwatch.responder.service import Responder
from iotwatch.settings import Settings, StreamSettings
from iotwatch.streaming.job import start
from iotwatch.streaming.rules import ReadingView, evaluate
from tests.helpers import InThread, read_topic, wait_for
from tests.support.homes import LEAK, THERMOSTAT

pytestmark = pytest.mark.slow

SPEEDUP = 6.0
DURATION_S = 420.0  # event time; the loop closes in the first ~200 s of it


def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "faults.json"
    path.write_text(
        json.dumps(
            {
                "anomalies": [
                    {"kind": "stuck_hvac", "devices": THERMOSTAT, "at_s": 5, "duration_s": 7200},
                    {"kind": "water_leak", "devices": LEAK, "at_s": 20, "duration_s": 3600},
                ]
            }
        )
    )
    return path


def config(seed: int, start_ms: int, faults: Path) -> SimConfig:
    return SimConfig(
        seed=seed,
        homes=1,
        vehicles=0,
        mix={"thermostat": 1, "leak_sensor": 1},
        start_ms=start_ms,
        duration_s=DURATION_S,
        scenario=faults,
    )


def night_start_ms(now_ms: int, hour_utc: int = 3) -> int:
    """The newest past ``hour_utc`` o'clock: the households are asleep, their thermostats in
    setback whatever the time the test runs (in the evening every simulated household is home
    and awake, and no seed has a stuck HVAC that passes its setpoint early). Event time then
    lies hours in the past; nothing here compares it with the wall clock (commands, replies
    and alert times are wall-clock)."""
    day_ms, hour_ms = 86_400_000, 3_600_000
    start = now_ms - now_ms % day_ms + hour_utc * hour_ms
    return start if start <= now_ms else start - day_ms


def seed_with_early_stuck_hvac(start_ms: int, faults: Path, within_s: float = 200.0) -> int:
    """A seed whose household is in its setback hours at ``start_ms``, so the stuck HVAC
    passes the setpoint at once (the rule needs 120 s of overshoot; from the comfort setpoint
    the room takes half an hour to get there). Judged by the streaming job's own rule."""
    stream = StreamSettings()
    for seed in range(1, 40):
        sim, since = Simulation(config(seed, start_ms, faults)), None
        while sim.now_ms < start_ms + within_s * 1000:
            for _, topic, payload, group in sim.tick():
                if group < 0 or "thermostat" not in topic:
                    continue
                reading = json.loads(payload)
                stuck = evaluate(ReadingView("thermostat", reading["metrics"], None, ()), stream).get(Rule.STUCK_HVAC)
                since = (since or reading["ts"]) if stuck is not None and stuck.score >= 0.5 else None
                if since is not None and reading["ts"] - since >= 130_000:
                    return seed
    raise AssertionError("no seed gives an early stuck HVAC at this time of day")


def test_stuck_hvac_and_leak_are_alerted_commanded_obeyed_and_cleared(
    spark: Any, test_settings: Settings, unique: str, tmp_path: Path
) -> None:
    settings = test_settings.model_copy(
        update={
            "stream": test_settings.stream.model_copy(update={"silence_timeout_s": 3600.0, "trigger_interval_s": 0.5}),
            "gateway": test_settings.gateway.model_copy(update={"client_id": f"gw-{unique}", "metrics_port": 0}),
            "respond": test_settings.respond.model_copy(
                update={"client_id": f"responder-{unique}", "reply_timeout_s": 60.0}
            ),
        }
    )
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    faults = scenario(tmp_path)
    start_ms = night_start_ms(int(time.time() * 1000))
    seed = seed_with_early_stuck_hvac(start_ms, faults)

    job = start(
        spark, settings, checkpoint_dir=tmp_path / "ck", archive_dir=tmp_path / "archive", query_name=f"loop_{unique}"
    )
    gateway = Gateway(settings)
    gateway.start()
    responder = InThread(lambda stop: Responder(settings, DEFAULT_POLICIES, stop))
    summary: dict[str, Any] = {}
    options = RunOptions(
        mqtt=settings.mqtt,
        qos=1,
        speedup=SPEEDUP,
        obey_commands=True,
        client_prefix=f"sim-{unique}",
        ground_truth=tmp_path / "truth.jsonl",
    )
    simulator = threading.Thread(
        target=lambda: summary.update(run(config(seed, start_ms, faults), options)), daemon=True
    )
    simulator.start()

    def alerts() -> list[dict[str, Any]]:
        return [json.loads(m.value()) for m in read_topic(settings.kafka, settings.topics.alerts, idle_s=0.5)]

    def lifecycle(device: str, rule: str) -> list[str]:
        return [a["state"] for a in alerts() if a["device_id"] == device and a["rule"] == rule]

    try:
        wait_for(
            lambda: (
                lifecycle(THERMOSTAT, "stuck_hvac") == ["raised", "cleared"]
                and lifecycle(LEAK, "water_leak") == ["raised", "cleared"]
            ),
            240,
            "both alerts raised and cleared",
        )
        simulator.join(DURATION_S / SPEEDUP + 60)
    finally:
        counts = responder.close()
        gateway.stop()
        job.stop()
    assert not simulator.is_alive()
    assert counts["commands_sent"] == 2 and counts["reply_done"] == 2 and "escalated" not in counts

    audits = {
        a.device_id: a
        for a in (
            decode(m.value(), CommandAudit) for m in read_topic(settings.kafka, settings.topics.commands, idle_s=1.0)
        )
    }
    assert [s.status.value for s in audits[THERMOSTAT].history] == ["sent", "accepted", "done"]
    assert [s.status.value for s in audits[LEAK].history] == ["sent", "accepted", "done"]
    assert (audits[THERMOSTAT].name, audits[LEAK].name) == ("reset_hvac", "close_valve")
    raised = {a["rule"]: a for a in alerts() if a["state"] == "raised"}
    cleared = {a["rule"]: a for a in alerts() if a["state"] == "cleared" and a["device_id"] in (THERMOSTAT, LEAK)}
    for device, rule in ((THERMOSTAT, "stuck_hvac"), (LEAK, "water_leak")):
        audit = audits[device]
        assert audit.alert_id == raised[rule]["alert_id"] == cleared[rule]["alert_id"]
        assert raised[rule]["detected_at_ms"] <= audit.issued_at_ms <= audit.history[-1].at_ms
        assert audit.history[-1].at_ms <= cleared[rule]["detected_at_ms"]  # the device obeyed, then it cleared
        assert raised[rule]["runbook_url"].endswith(f"#{rule}")

    # the ground truth says the faults ended because of the commands; the devices counted them
    truth = {r.kind: r for r in read_ground_truth(tmp_path / "truth.jsonl")}
    assert truth["stuck_hvac"].ended_by_command == audits[THERMOSTAT].command_id
    assert truth["water_leak"].ended_by_command == audits[LEAK].command_id
    assert summary["commands"] == {"accepted": 2, "done": 2}
