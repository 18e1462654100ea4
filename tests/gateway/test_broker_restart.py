"""The MQTT broker (mosquitto with persistence) restarted under a running gateway and a
QoS 1 publisher: nothing is lost by seq (issue 12).

The publisher must publish again what paho refuses while disconnected (``rc`` not 0: paho
does not keep it); without that, a few readings published in the instant of the restart
were lost before they reached the broker (seen here, in 4 runs of 6).

What the gateway cannot see: mosquitto 2.0.11 acknowledged to the publisher a reading or
two per device in the last milliseconds before its SIGTERM shutdown and never delivered
them after the restart (about one run in two here; the same with stock paho in the
gateway, so not its buffered reads). The test therefore checks that anything missing was
published within that instant and that the gateway counted it as a seq gap (nothing
silent); everything published before and after arrives."""

from __future__ import annotations

import time
from pathlib import Path

from gateway.bridge import Gateway
from iotwatch.clients.kafka import ensure_topics
from iotwatch.settings import Settings
from iotwatch.stack.mqtt_broker import start_mqtt_broker
from iotwatch.stack.process import stop_process
from tests.gateway.conftest import gateway_settings
from tests.helpers import Publisher, read_all_seqs, read_topic


def test_mosquitto_restart_with_persistence_loses_nothing(test_settings: Settings, unique: str,
                                                          tmp_path: Path) -> None:
    broker = start_mqtt_broker(tmp_path, "mosquitto", timeout_s=30)
    mqtt = test_settings.mqtt.model_copy(update={"url": broker.endpoint})
    settings = gateway_settings(test_settings.model_copy(update={"mqtt": mqtt}), unique)
    ensure_topics(settings.kafka, [settings.topics.raw, settings.topics.dlq])
    bridge = Gateway(settings)
    bridge.start()
    devices = [f"rs-{unique}-{i}" for i in range(4)]
    publisher = Publisher(mqtt, devices, count=1500, rate_per_s=1000).start()
    try:
        time.sleep(2.0)
        stopped_at = time.time()
        stop_process(broker.process)  # SIGTERM: mosquitto writes its persistence file and exits
        time.sleep(1.0)
        broker = start_mqtt_broker(tmp_path, "mosquitto", timeout_s=30, port=int(broker.endpoint.rsplit(":", 1)[1]))
        publisher.join(timeout=120)
        _records, seqs = read_all_seqs(settings.kafka, settings.topics.raw, devices, 1500, timeout_s=30)
        summary = bridge.stop()
    finally:
        stop_process(broker.process)
    dead = read_topic(settings.kafka, settings.topics.dlq, timeout_s=5, idle_s=1)
    assert not dead, [(m.headers(), m.value()[:200]) for m in dead]
    missing = {(device, seq) for device in devices for seq in set(range(1500)) - set(seqs.get(device, ()))}
    published_at = {(device, seq): at for device in devices for seq, at in publisher.published[device]}
    late = {key: round(published_at[key] - stopped_at, 3) for key in missing
            if not -0.1 < published_at[key] - stopped_at < 0.1}
    assert not late, f"lost outside the instant of the broker's shutdown (s after it): {late}"
    assert len(missing) <= 2 * len(devices), sorted(missing)
    assert summary["seq_gaps"] >= len(missing)  # counted: nothing lost silently
    assert summary["inflight"] == 0
