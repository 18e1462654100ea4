"""The poison corpus, as MQTT messages, and how to publish it: shared by the
gateway's poison test and the end-to-end one (gateway and streaming job in one run)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from iotwatch.contract.device_topics import telemetry_topic
from iotwatch.contract.telemetry import MAX_SEQ
from iotwatch.settings import MqttSettings

#: (name, MQTT topic, payload, expected): a dead-letter reason, or ``forwarded`` where the
#: contract lets it through for the streaming job to judge (docs/operate/gateway.md).
Case = tuple[str, str, bytes, str]


def body(device: str, site: str = "poison", device_type: str = "thermostat", **fields: object) -> dict[str, object]:
    message: dict[str, object] = {
        "v": 1,
        "device_id": device,
        "device_type": device_type,
        "site": site,
        "seq": 0,
        "ts": int(time.time() * 1000),
        "metrics": {"temperature_c": 21.0},
    }
    message.update(fields)
    return message


def corpus(unique: str) -> list[Case]:
    """One message of each kind that once stopped or wedged a component."""

    def case(name: str, expected: str, device_type: str = "thermostat", site: str = "poison", **fields: object) -> Case:
        device = f"p-{name}-{unique}"
        return (
            name,
            telemetry_topic(site, device_type, device),
            json.dumps(body(device, site, device_type, **fields)).encode(),
            expected,
        )

    deep_device = f"p-deep-{unique}"
    deep = json.dumps(body(deep_device))[:-1].encode() + b',"event_data":{"x":' + b"[" * 50_000 + b"]" * 50_000 + b"}}"
    big_device = f"p-big-{unique}"
    big = json.dumps(body(big_device, event_data={"pad": "x" * (2 * 1024 * 1024)})).encode()
    conflict = f"p-conflict-{unique}"
    return [
        case("seq-2-63", "invalid_field", seq=MAX_SEQ + 1),
        case("seq-minus-1", "invalid_field", seq=-1),
        case("colon-type", "invalid_field", device_type="a:b"),
        case("metrics-1000", "too_many_metrics", metrics={f"m{i}": float(i) for i in range(1000)}),
        case("future-23h", "forwarded", ts=int(time.time() * 1000) + 23 * 3600 * 1000),
        case("future-25h", "ts_in_future", ts=int(time.time() * 1000) + 25 * 3600 * 1000),
        case("nan", "non_finite_number", metrics={"temperature_c": float("nan")}),
        # a thermostat reading with a meter's and a vehicle's metric: never scored as a thermostat's
        case(
            "foreign-metric", "unknown_metric", metrics={"temperature_c": 21.0, "power_w": 800.0, "coolant_temp_c": 9.0}
        ),
        ("deep-nesting", telemetry_topic("poison", "thermostat", deep_device), deep, "invalid_json"),
        ("2mb", telemetry_topic("poison", "thermostat", big_device), big, "too_large"),
        ("binary", telemetry_topic("poison", "thermostat", f"p-binary-{unique}"), b"\x00\xff{{{", "invalid_utf8"),
        ("not-json", telemetry_topic("poison", "thermostat", f"p-garbage-{unique}"), b"{not json", "invalid_json"),
        # The same device id under a second site: the gateway cannot know, the job judges it.
        (
            "identity-a",
            telemetry_topic("site-a", "thermostat", conflict),
            json.dumps(body(conflict, "site-a")).encode(),
            "forwarded",
        ),
        (
            "identity-b",
            telemetry_topic("site-b", "thermostat", conflict),
            json.dumps(body(conflict, "site-b")).encode(),
            "forwarded",
        ),
    ]


def publish(client: Any, mqtt: MqttSettings, cases: list[Case], folder: Path) -> None:
    """Publish ``cases`` in order at QoS 1, each acknowledged before the next: half with
    ``client`` (paho, connected), half with the third-party mosquitto_pub, its payload from a file."""
    mosquitto_pub = shutil.which("mosquitto_pub")
    assert mosquitto_pub, "mosquitto_pub (Debian mosquitto-clients) is required"
    for index, (name, topic, payload, _expected) in enumerate(cases):
        if index % 2:
            path = folder / name
            path.write_bytes(payload)
            subprocess.run(
                [mosquitto_pub, "-h", mqtt.host, "-p", str(mqtt.port), "-q", "1", "-t", topic, "-f", str(path)],
                check=True,
                timeout=30,
            )
        else:
            client.publish(topic, payload, qos=1).wait_for_publish(30)
