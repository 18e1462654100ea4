"""Sites: edge Kafka clusters replicated to the central one by MirrorMaker 2, under faults.

One stack with two sites serves every test here (module scope: starting five JVMs costs
about 40 s). Each test uses device ids of its own and judges only its own readings in the
topics the tests share.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from gateway.bridge import Gateway
from iotwatch.clients.kafka import client_config, list_topics
from iotwatch.replication import ReplicationLag
from iotwatch.settings import KafkaSettings, Settings
from iotwatch.stack import EmbeddedStack, StackState
from iotwatch.stack.mirror_maker import remote_topic, restart_mirror_maker
from iotwatch.stack.process import stop_process
from iotwatch.stack.sites import site_role
from tests.helpers import Publisher, assert_no_loss, read_all_seqs, read_topic, reading, wait_for
from tests.support.gateway import gateway_settings

LINK_CUT_S = 60.0


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory, base_settings: Settings) -> Iterator[StackState]:
    stack = base_settings.stack.model_copy(update={"sites": 2, "influxdb": "none"})
    embedded = EmbeddedStack(base_settings.model_copy(update={"stack": stack}), tmp_path_factory.mktemp("sites"))
    state = embedded.up()
    try:
        yield state
    finally:
        embedded.down()


def central(state: StackState) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=state.services["kafka"].endpoint)


def edge(state: StackState, site: str) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=state.site_endpoints(site)["kafka"])


def site_settings(state: StackState, base: Settings, site: str) -> Settings:
    ends = state.site_endpoints(site)
    return base.with_endpoints(mqtt=ends["mqtt"], kafka=ends["kafka"], influx="")


def restart_link(state: StackState, site: str, topics: object) -> None:
    """Start the site's MirrorMaker again and record the new process for the stack's stop."""
    role = site_role(site, "mirror")
    state.services[role] = restart_mirror_maker(state.services[role], site, topics, central(state), 120)  # type: ignore[arg-type]
    state.save()


def produce(kafka: KafkaSettings, topic: str, devices: list[str], seqs: range, rate_per_s: float = 0.0) -> None:
    """Readings straight into a site's cluster (what its gateway does), confirmed."""
    producer = Producer({**client_config(kafka), "enable.idempotence": True, "linger.ms": 5})
    started, sent = time.monotonic(), 0
    for seq in seqs:
        for device in devices:
            producer.produce(topic, reading(device, seq).to_json(), key=device.encode())
            sent += 1
        producer.poll(0)
        if rate_per_s:
            delay = started + sent / rate_per_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    assert producer.flush(30) == 0


def copies(records: list, devices: list[str]) -> Counter[tuple[str, int]]:
    """(device, seq) -> how many copies of it the records hold, for ``devices`` only."""
    import json

    wanted = set(devices)
    counted: Counter[tuple[str, int]] = Counter()
    for record in records:
        body = json.loads(record.value())
        if body["device_id"] in wanted:
            counted[(body["device_id"], body["seq"])] += 1
    return counted


def test_a_site_keeps_ingesting_through_a_60_s_link_cut_and_the_centre_catches_up(
    sites: StackState, base_settings: Settings, unique: str
) -> None:
    topics = base_settings.topics
    replica = remote_topic("site1", topics.raw)
    settings = gateway_settings(site_settings(sites, base_settings, "site1"), unique)
    gateway = Gateway(settings)
    gateway.start()
    devices = [f"cut-{unique}-{i}" for i in range(4)]
    count = int((LINK_CUT_S + 10) * 25)  # 100 readings/s through the site's gateway, 10 s past the cut
    others = [f"cut-{unique}-site2"]
    mirror = site_role("site1", "mirror")
    try:
        stop_process(sites.services[mirror].process)  # the link is cut
        cut_at = time.monotonic()
        publisher = Publisher(settings.mqtt, devices, count=count, rate_per_s=100).start()
        # the other site's link is its own: its readings reach the centre during the cut
        produce(edge(sites, "site2"), topics.raw, others, range(200))
        _, site2 = read_all_seqs(central(sites), remote_topic("site2", topics.raw), others, 200, timeout_s=30)
        assert_no_loss(site2, others, 200)
        time.sleep(max(0.0, LINK_CUT_S - 3 - (time.monotonic() - cut_at)))
        at_site = len(copies(read_topic(edge(sites, "site1"), topics.raw, idle_s=0.5), devices))
        at_centre = sum(copies(read_topic(central(sites), replica, idle_s=0.5), devices).values())
        assert at_site >= int((LINK_CUT_S - 5) * 100 * 0.9), f"the site stopped ingesting ({at_site} readings)"
        assert at_centre == 0, "readings crossed a cut link"
        lag = ReplicationLag(central(sites), ["site1", "site2"])
        during = lag.sample()
        assert during["site1"] is not None and during["site1"] >= (LINK_CUT_S - 10) * 1000, during
        assert during["site2"] is not None and during["site2"] < 10_000, during
        time.sleep(max(0.0, LINK_CUT_S - (time.monotonic() - cut_at)))
    finally:
        restart_link(sites, "site1", topics)
    after = lag.sample()["site1"]
    lag.close()
    assert after is not None and after < 10_000, f"replication lag {after} ms after the link is back"
    try:
        publisher.join(timeout=60)
    finally:
        gateway.stop()
    records, seqs = read_all_seqs(central(sites), replica, devices, count, timeout_s=90)
    assert_no_loss(seqs, devices, count)
    duplicates = sum(n - 1 for n in copies(records, devices).values())
    print(
        f"link cut {LINK_CUT_S:.0f} s: {len(devices) * count} readings, {duplicates} duplicates at the centre; "
        f"replication lag {during['site1']} ms during the cut, {after} ms after"
    )


def test_mirror_maker_killed_mid_run_and_restarted_loses_nothing(
    sites: StackState, base_settings: Settings, unique: str
) -> None:
    topics = base_settings.topics
    devices = [f"kill-{unique}-{i}" for i in range(5)]
    count = 1000  # 5,000 readings at 500/s: the kill falls in the middle
    producing = threading.Thread(
        target=produce, args=(edge(sites, "site1"), topics.raw, devices, range(count), 500.0), daemon=True
    )
    producing.start()
    time.sleep(4.0)
    mirror = sites.services[site_role("site1", "mirror")].process
    os.kill(mirror.pid, signal.SIGKILL)
    wait_for(lambda: not mirror.is_running(), 10, "MirrorMaker gone after kill -9")
    time.sleep(2.0)
    restart_link(sites, "site1", topics)
    producing.join(60)
    assert not producing.is_alive()
    records, seqs = read_all_seqs(central(sites), remote_topic("site1", topics.raw), devices, count, timeout_s=90)
    assert_no_loss(seqs, devices, count)
    duplicates = sum(n - 1 for n in copies(records, devices).values())
    print(f"kill -9: {len(devices) * count} readings, {duplicates} duplicates at the centre")


def committed(kafka: KafkaSettings, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition (partitions without one left out)."""
    consumer = Consumer({**client_config(kafka), "group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found if tp.offset >= 0}


def test_a_group_fails_over_to_the_replica_with_translated_offsets(
    sites: StackState, base_settings: Settings, unique: str
) -> None:
    topics = base_settings.topics
    site = edge(sites, "site2")
    replica = remote_topic("site2", topics.raw)
    partitions = list_topics(site)[topics.raw]
    devices = [f"failover-{unique}-{i}" for i in range(8)]
    group = f"oncall-{unique}"
    # A consumer of the site's topic reads and commits 200 readings per device...
    consumer = Consumer({**client_config(site), "group.id": group, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topics.raw, p) for p in range(partitions)])
    produce(site, topics.raw, devices, range(200))
    committed_part = _read_mine(consumer, devices, 200 * len(devices))
    consumer.commit(asynchronous=False)
    # ... MirrorMaker writes the translated offsets into the centre's group ...
    wait_for(
        lambda: len(committed(central(sites), group, replica, partitions)) == partitions,
        60,
        "translated offsets of the group at the centre",
    )
    # ... it reads 50 more per device without committing them, and dies; the site goes on.
    produce(site, topics.raw, devices, range(200, 250))
    uncommitted_part = _read_mine(consumer, devices, 50 * len(devices))
    consumer.close()
    produce(site, topics.raw, devices, range(250, 300))
    # The group fails over to the centre and reads on from its translated offsets.
    failover = Consumer(
        {**client_config(central(sites)), "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "error"}
    )
    failover.subscribe([replica])
    wanted = {(d, s) for d in devices for s in range(200, 300)}
    seen = set(_read_mine(failover, devices, len(wanted), until=wanted))
    failover.close()
    assert wanted <= seen, f"{len(wanted - seen)} readings the group never read"
    assert not (seen & set(committed_part)), f"{len(seen & set(committed_part))} committed readings read again"
    reread = seen & set(uncommitted_part)
    assert len(reread) <= len(uncommitted_part)
    print(
        f"failover: {len(committed_part)} readings committed at the site, {len(uncommitted_part)} consumed but "
        f"not committed; at the centre {len(reread)} of these read again, no committed one"
    )


def _read_mine(
    consumer: Consumer, devices: list[str], count: int, until: set[tuple[str, int]] | None = None
) -> list[tuple[str, int]]:
    """(device, seq) of the next ``count`` records of ``devices`` (or until ``until`` is seen)."""
    mine: list[tuple[str, int]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (len(mine) < count if until is None else not until <= set(mine)):
        for m in consumer.consume(1000, 0.5):
            if m.error() is None and m.key() and m.key().decode() in devices:
                mine.append((m.key().decode(), _seq(m)))
    return mine


def _seq(message: object) -> int:
    import json

    return int(json.loads(message.value())["seq"])  # type: ignore[attr-defined]
