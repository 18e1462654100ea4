"""The large-fleet run of ``iotwatch bench simulate``: can one process carry the fleet in real
time? Tick lag behind due time, peak RSS, and every device's seq checked at a subscriber in
another process (gap-free, in order, nothing else)."""

from __future__ import annotations

import math
import multiprocessing as mp
import time
from typing import Any

from iotwatch.devices.broker_run import RunOptions, run
from iotwatch.devices.config import HOME_TYPES, SimConfig
from iotwatch.settings import MqttSettings

__all__ = ["GOAL_LAG_P99_S", "GOAL_RSS_MB", "fleet_run"]

#: a tick handed to the connections at most this late (p99), in this much memory
GOAL_LAG_P99_S = 1.0
GOAL_RSS_MB = 1024.0

_TELEMETRY = "iot/+/+/+/telemetry"
_IDLE_S = 10.0  # the subscriber gives up this long after its last message


def _subscriber(mqtt: MqttSettings, ready: Any, expected: Any, results: Any) -> None:
    """Counts what arrives per device; ``expected`` (-1 until the run ends) says when to stop."""
    import threading

    from iotwatch.clients.mqtt import make_client
    from iotwatch.contract.telemetry import ContractViolation, decode_telemetry

    next_seq: dict[str, int] = {}
    broken: set[str] = set()  # devices with a gap, a duplicate or a message out of order
    counts = {"received": 0, "invalid": 0, "missing": 0, "duplicates_or_reordered": 0}
    last = [time.monotonic()]
    subscribed = threading.Event()

    def on_message(_c: Any, _u: Any, message: Any) -> None:
        last[0] = time.monotonic()
        try:
            reading = decode_telemetry(message.payload)
        except ContractViolation:
            counts["invalid"] += 1
            return
        counts["received"] += 1
        device, seq = reading.device_id, reading.seq
        want = next_seq.get(device, 0)
        if seq == want:
            next_seq[device] = seq + 1
            return
        broken.add(device)
        if seq > want:
            counts["missing"] += seq - want
            next_seq[device] = seq + 1
        else:
            counts["duplicates_or_reordered"] += 1

    try:
        client = make_client(mqtt, f"iotwatch-bench-fleet-sub-{time.monotonic_ns()}", buffered_reads=True)
        client.on_message = on_message
        client.on_subscribe = lambda *_: subscribed.set()
        client.connect(mqtt.host, mqtt.port, keepalive=mqtt.keepalive_s)
        client.loop_start()
        client.subscribe(_TELEMETRY, qos=1)
        if not subscribed.wait(30):
            raise TimeoutError("the broker did not confirm the subscription within 30 s")
        ready.set()
        while True:
            time.sleep(0.2)
            target = expected.value
            if target >= 0 and (counts["received"] >= target or time.monotonic() - last[0] > _IDLE_S):
                break
        time.sleep(1.0)  # anything beyond the expected count would show up now
        client.disconnect()
        client.loop_stop()
        results.put(
            {
                **counts,
                "devices": len(next_seq),
                "gap_free_devices": len(next_seq) - len(broken),
            }
        )
    except BaseException as exc:
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def _simulator(mqtt: MqttSettings, config: SimConfig, results: Any) -> None:
    """The simulator in a process of its own, so that its peak RSS is the fleet's alone."""
    try:
        results.put(run(config, RunOptions(mqtt=mqtt, qos=1, processes=1, connections=2)))
    except BaseException as exc:
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def fleet_config(devices: int, interval_s: float, duration_s: float) -> SimConfig:
    """Homes of one device of each type, ``devices`` in all (rounded up to whole homes)."""
    return SimConfig(
        seed=7,
        homes=math.ceil(devices / len(HOME_TYPES)),
        vehicles=0,
        mix=dict.fromkeys(HOME_TYPES, 1),
        rate=1.0 / interval_s,
        start_ms=int(time.time() * 1000),
        duration_s=duration_s,
    )


def fleet_run(mqtt: MqttSettings, devices: int, interval_s: float, duration_s: float) -> dict[str, Any]:
    """One real-time simulator process with the whole fleet, checked by a subscriber."""
    ctx = mp.get_context("spawn")
    ready, expected, results = ctx.Event(), ctx.Value("q", -1), ctx.Queue()
    subscriber = ctx.Process(target=_subscriber, args=(mqtt, ready, expected, results), daemon=True)
    subscriber.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the fleet run's subscriber did not start")
        done = ctx.Queue()
        simulator = ctx.Process(target=_simulator, args=(mqtt, fleet_config(devices, interval_s, duration_s), done))
        simulator.start()
        summary = done.get(timeout=duration_s + 300)
        simulator.join(timeout=30)
        if "error" in summary:
            raise RuntimeError(f"the fleet run's simulator failed: {summary['error']}")
        expected.value = summary["sent"]
        received = results.get(timeout=duration_s + 120)
    finally:
        subscriber.join(timeout=30)
        if subscriber.is_alive():
            subscriber.kill()
    if "error" in received:
        raise RuntimeError(f"the fleet run's subscriber failed: {received['error']}")
    lag = summary["tick_lag"] or {}
    gap_free = (
        received["devices"] == summary["device_total"] == received["gap_free_devices"]
        and received["received"] == summary["sent"]
        and received["invalid"] == 0
    )
    return {
        "devices_per_process": summary["device_total"],
        "interval_s": interval_s,
        "duration_s": duration_s,
        "qos": 1,
        "target_rate": summary["target_rate"],
        "achieved_rate": summary["achieved_rate"],
        "sent": summary["sent"],
        "errors": summary["errors"],
        "tick_lag": lag,
        "peak_rss_mb": summary["peak_rss_mb"],
        "publish_latency": summary["publish_latency"],
        "subscriber": received,
        "on_schedule": lag.get("p99_s") is not None and lag["p99_s"] < GOAL_LAG_P99_S,
        "within_memory": summary["peak_rss_mb"] < GOAL_RSS_MB,
        "every_device_gap_free": gap_free,
    }
