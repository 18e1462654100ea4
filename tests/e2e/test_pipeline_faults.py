"""Faults through the whole ingestion path in one run: real MQTT
clients publish to mosquitto, ``Gateway`` forwards to Apache Kafka and one
running streaming job (Spark local, fleet scoring on) scores, dead-letters and archives.

One gateway and one job serve every test of this module (the job's start-up is most of
the cost); each test uses its own device ids, and the job's totals are shared, so a test
asserts only on counters no other test here moves.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from iotwatch.clients.kafka import ensure_topics
from iotwatch.clients.mqtt import make_client
from iotwatch.contract.dead_letters import H_REASON, H_STAGE, header_value
from iotwatch.contract.device_topics import telemetry_topic
from iotwatch.gateway.bridge import Gateway
from iotwatch.settings import Settings
from iotwatch.streaming.job import RunningJob, start
from tests.helpers import read_topic, reading, wait_for
from tests.support.corpus import corpus, publish
from tests.support.gateway import gateway_settings

pytestmark = pytest.mark.slow


@dataclass
class Pipeline:
    settings: Settings
    gateway: Gateway
    job: RunningJob
    archive: Path
    folder: Path

    def archived(self, device: str) -> pd.DataFrame:
        """The archive's rows of ``device`` so far (files are renamed into place: never half read)."""
        try:
            frame = pd.read_parquet(self.archive / "readings", filters=[("device_id", "==", device)])
        except (FileNotFoundError, OSError, ValueError):  # nothing written yet
            return pd.DataFrame(columns=["device_id", "seq"])
        return frame

    def publish_readings(self, device: str, seqs_and_ts: list[tuple[int, int]]) -> None:
        """Valid readings of ``device`` through mosquitto at QoS 1, each acknowledged."""
        mqtt = self.settings.mqtt
        client = make_client(mqtt, f"pub-{device}")
        client.connect(mqtt.host, mqtt.port)
        client.loop_start()
        try:
            for seq, ts in seqs_and_ts:
                info = client.publish(
                    telemetry_topic("home-1", "thermostat", device),
                    reading(device, seq, ts=ts, value=21.0 + seq % 5 * 0.1).to_json(),
                    qos=1,
                )
            info.wait_for_publish(30)
        finally:
            client.disconnect()
            client.loop_stop()


@pytest.fixture(scope="module")
def pipeline(spark: Any, stack_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """A gateway and a streaming job on their own topics, running until the module ends."""
    run = uuid.uuid4().hex[:10]
    folder = tmp_path_factory.mktemp("pipeline")
    topics = stack_settings.topics.model_copy(
        update={
            "raw": f"pf.{run}.raw",
            "dlq": f"pf.{run}.dlq",
            "alerts": f"pf.{run}.alerts",
            "model_updates": f"pf.{run}.model",
            "commands": f"pf.{run}.commands",
        }
    )
    stream = stack_settings.stream.model_copy(
        update={"silence_timeout_s": 3600.0, "trigger_interval_s": 0.5, "fleet_detector": "isolation_forest"}
    )
    settings = stack_settings.model_copy(
        update={
            "topics": topics,
            "stream": stream,
            "registry": stack_settings.registry.model_copy(update={"path": folder / "registry"}),
        }
    )
    settings = gateway_settings(settings, run)
    ensure_topics(settings.kafka, settings.topics.kafka_topics())
    gateway = Gateway(settings)
    gateway.start()
    job = start(
        spark, settings, checkpoint_dir=folder / "ck", archive_dir=folder / "archive", query_name=f"faults_{run}"
    )
    try:
        yield Pipeline(settings, gateway, job, folder / "archive", folder)
    finally:
        job.stop()
        gateway.stop()


def test_poison_corpus_through_the_gateway_into_the_job(pipeline: Pipeline) -> None:
    """seq 2^63 and -1, a device type with a colon, 1,000 metrics, 2 MB, deep nesting, an
    identity conflict, a reading 23 h ahead (and a few more) through mosquitto, the gateway
    and the job, then 100 valid readings: both keep running, each poison message is a dead
    letter with its reason (from the gateway, or from the job for the identity conflict) or
    handled as documented (23 h ahead: within the skew, scored), and all 100 are archived
    with their scores."""
    run = uuid.uuid4().hex[:8]
    cases = corpus(run)
    mqtt = pipeline.settings.mqtt
    client = make_client(mqtt, f"poison-{run}")
    client.connect(mqtt.host, mqtt.port)
    client.loop_start()
    try:
        publish(client, mqtt, cases, pipeline.folder)
    finally:
        client.disconnect()
        client.loop_stop()
    good = f"good-{run}"
    now = int(time.time() * 1000)
    pipeline.publish_readings(good, [(seq, now - 100_000 + seq * 1000) for seq in range(100)])

    wait_for(lambda: len(pipeline.archived(good)) >= 100, 120, "the 100 valid readings in the archive")
    archived = pipeline.archived(good)
    assert sorted(archived["seq"]) == list(range(100))
    scored = archived["scores"].map(lambda scores: scores is not None and scores.get("temperature_c") is not None)
    assert scored.all(), f"{(~scored).sum()} of 100 readings archived without a temperature score"

    gateway_dead = {c[1].split("/")[3]: c[3] for c in cases if c[3] != "forwarded"}
    conflict = next(c[1].split("/")[3] for c in cases if c[0] == "identity-b")
    expected = {**gateway_dead, conflict: "identity_conflict"}
    dead = read_topic(pipeline.settings.kafka, pipeline.settings.topics.dlq, timeout_s=30, idle_s=3)
    got = {
        (m.key() or b"").decode(): (header_value(m.headers(), H_REASON), header_value(m.headers(), H_STAGE))
        for m in dead
        if run in (m.key() or b"").decode()
    }
    assert {device: reason for device, (reason, _stage) in got.items()} == expected
    assert got[conflict][1] == "stream" and all(got[d][1] == "gateway" for d in gateway_dead)
    ahead = next(c[1].split("/")[3] for c in cases if c[0] == "future-23h")
    first = next(c[1].split("/")[3] for c in cases if c[0] == "identity-a")
    assert len(pipeline.archived(ahead)) == 1 and len(pipeline.archived(first)) == 1

    assert pipeline.job.query.isActive and pipeline.job.query.exception() is None
    assert pipeline.gateway.health()[0], pipeline.gateway.health()
    assert pipeline.gateway.report()["inflight"] == 0


def test_a_device_that_reboots_after_100_readings_is_archived_whole(pipeline: Pipeline) -> None:
    """100 readings, a reboot (seq back to 0 while event time goes on), 50 more, through
    mosquitto, the gateway and the job: all 150 archived, and the job counts one seq reset
    (no other test of this module restarts a device's seq)."""
    device = f"reboot-{uuid.uuid4().hex[:8]}"
    t0 = int(time.time() * 1000) - 300_000
    before = [(seq, t0 + seq * 1000) for seq in range(100)]
    after = [(seq, t0 + (100 + seq) * 1000) for seq in range(50)]
    pipeline.publish_readings(device, before + after)
    wait_for(lambda: len(pipeline.archived(device)) >= 150, 120, "150 readings of the rebooted device archived")
    archived = pipeline.archived(device)
    assert sorted(archived["seq"]) == sorted(list(range(100)) + list(range(50)))
    assert sorted(archived["event_ms"]) == [ts for _seq, ts in before + after]
    wait_for(lambda: pipeline.job.totals.get("seq_resets", 0) >= 1, 30, "the seq reset in the job's totals")
    assert pipeline.job.totals["seq_resets"] == 1
    assert pipeline.job.query.isActive and pipeline.job.query.exception() is None


def test_counts_add_up_from_the_gateway_through_the_job(pipeline: Pipeline) -> None:
    """One meaning per number, end to end: every message the gateway received it forwarded
    (a reading on the raw topic) or dead-lettered, never both; the job received what the
    gateway forwarded (records without a readable device count as ``no_device``), and each
    record it received it scored, removed as a duplicate, or dead-lettered (as late, or for
    another reason). Checked over the whole module's traffic once everything is drained."""
    run = uuid.uuid4().hex[:8]
    device = f"count-{run}"
    now = int(time.time() * 1000)
    readings = [(seq, now - 60_000 + seq * 1000) for seq in range(40)]
    pipeline.publish_readings(device, [*readings, readings[5], readings[6]])  # two sent again: duplicates
    mqtt = pipeline.settings.mqtt
    client = make_client(mqtt, f"count-{run}")
    client.connect(mqtt.host, mqtt.port)
    client.loop_start()
    try:
        foreign = reading(f"odd-{run}", 0).to_json().replace(b'"temperature_c"', b'"power_w"')
        client.publish(telemetry_topic("home-1", "thermostat", f"odd-{run}"), foreign, qos=1).wait_for_publish(30)
    finally:
        client.disconnect()
        client.loop_stop()
    gateway, totals = pipeline.gateway, pipeline.job.totals

    def drained() -> bool:
        snapshot = gateway.report()
        return snapshot["inflight"] == 0 and totals["received"] + totals["no_device"] == snapshot["forwarded"]

    wait_for(lambda: len(pipeline.archived(device)) >= 40 and drained(), 120, "the job caught up with the gateway")
    snapshot = gateway.report()
    assert snapshot["received"] == snapshot["forwarded"] + snapshot["dead_lettered"]
    assert snapshot["dead_letter_reasons"].get("unknown_metric", 0) >= 1
    assert totals["received"] + totals["no_device"] == snapshot["forwarded"]
    scored, dropped = totals["reading_records"], totals["duplicate"] + totals["late"] + totals["dlq"]
    assert totals["received"] == scored + dropped, dict(totals)
    assert totals["duplicate"] >= 2
    assert sorted(pipeline.archived(device)["seq"]) == list(range(40))
