"""The model registry on disk, its model-update events and the watcher, with the real broker."""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from confluent_kafka import Consumer, TopicPartition

from iotwatch.contract.model_updates import ModelUpdate
from iotwatch.models.base import Detector
from iotwatch.models.iforest import IsolationForest
from iotwatch.models.registry import ModelRegistry, RegistryError, TrainedOn
from iotwatch.models.robust_zscore import RobustZScore
from iotwatch.models.updates import UpdatePublisher
from iotwatch.models.watcher import ModelWatcher
from iotwatch.settings import RegistrySettings, Settings

DT, DET = "thermostat", "isolation_forest"


def _forest(seed: int) -> IsolationForest:
    rng = np.random.default_rng(seed)
    return IsolationForest(n_estimators=10, seed=seed).fit(pd.DataFrame({"t": rng.normal(20, 1, 300)}))


def test_register_approve_retire_and_list(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    trained = {"from_ms": 1, "to_ms": 2, "rows": 300, "devices": 3}
    v1 = registry.register(_forest(1), DT, trained_on=trained, evaluation={"p99": 0.6})
    v2 = registry.register(_forest(2), DT, trained_on=TrainedOn(rows=5))
    other = registry.register(RobustZScore(), "meter")
    assert (v1.version, v2.version, other.version) == (1, 2, 1)
    assert v1.status == "candidate" and v1.trained_on.devices == 3 and v1.params["n_estimators"] == 10
    assert registry.latest_approved(DT, DET) is None

    registry.approve(DT, DET, 1)
    registry.approve(DT, DET, 2)
    assert registry.latest_approved(DT, DET).version == 2
    assert registry.retire(DT, DET, 2).status == "retired"
    assert registry.latest_approved(DT, DET).version == 1  # falls back
    with pytest.raises(RegistryError, match="retired"):
        registry.approve(DT, DET, 2)
    with pytest.raises(RegistryError, match="no version 9"):
        registry.approve(DT, DET, 9)

    assert [(m.device_type, m.version) for m in registry.versions()] == [("meter", 1), (DT, 1), (DT, 2)]
    assert [m.version for m in registry.versions(DT, DET, status="retired")] == [2]
    assert registry.approved_families() == [(DT, DET)]
    # metadata on disk is plain JSON; the artefact reloads into an equal scorer
    doc = json.loads((v1.path / "metadata.json").read_text())
    assert doc["version"] == 1 and doc["status"] == "approved" and doc["trained_on"]["rows"] == 300
    frame = pd.DataFrame({"t": [20.0, 35.0]})
    np.testing.assert_array_equal(
        registry.load(registry.get(DT, DET, 1)).score_many(frame), _forest(1).score_many(frame)
    )
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".staging") or p.name.endswith(".tmp")]


def test_bad_names_and_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = ModelRegistry(tmp_path)
    for bad in ("../x", "", ".hidden", "a/b"):
        with pytest.raises(RegistryError):
            registry.register(RobustZScore(), bad)
    monkeypatch.setenv("IOTWATCH_REGISTRY_PATH", str(tmp_path / "elsewhere"))
    assert RegistrySettings().path == tmp_path / "elsewhere"


def _register_many(root: str, seed: int, count: int) -> list[int]:
    registry = ModelRegistry(root)
    return [registry.register(_forest(seed * 100 + i), DT).version for i in range(count)]


def test_concurrent_registration_does_not_corrupt(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        results = pool.starmap(_register_many, [(str(tmp_path), seed, 4) for seed in range(3)])
    versions = sorted(v for r in results for v in r)
    assert versions == list(range(1, 13))
    registry = ModelRegistry(tmp_path)
    listed = registry.versions(DT, DET)
    assert [m.version for m in listed] == versions
    for meta in listed:
        assert isinstance(registry.load(meta), IsolationForest)
    # each process saw its own versions increase
    assert all(r == sorted(r) for r in results)


def _wait_for(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.1)


def test_watcher_hot_swaps_on_approve_and_retire(tmp_path: Path, test_settings: Settings) -> None:
    topic = test_settings.topics.model_updates
    publisher = UpdatePublisher(test_settings.kafka, topic)
    registry = ModelRegistry(tmp_path, publisher=publisher)
    registry.register(_forest(1), DT)
    registry.approve(DT, DET, 1)  # approved before the watcher starts: loaded from disk

    with ModelWatcher(ModelRegistry(tmp_path), test_settings.kafka, topic, check_interval_s=0) as watcher:
        version, first = watcher.current_version(DT, DET) or (None, None)
        assert isinstance(first, Detector) and version is not None and version.version == 1
        assert watcher.current_version(DT, DET) == (version, first)  # no change: no reload
        assert watcher.current_version("meter", DET) is None

        registry.register(_forest(2), DT)
        assert watcher.current_version(DT, DET)[0].version == 1  # a candidate is not served
        registry.approve(DT, DET, 2)
        _wait_for(lambda: watcher.current_version(DT, DET)[0].version == 2)
        assert watcher.events_seen >= 1

        registry.retire(DT, DET, 2)
        _wait_for(lambda: watcher.current_version(DT, DET)[0].version == 1)
        registry.retire(DT, DET, 1)
        _wait_for(lambda: watcher.current_version(DT, DET) is None)
        assert watcher.reloads == 3  # v1 at start, v2, v1 again

    # the events on the topic: keyed by device type, JSON with the documented fields
    consumer = Consumer(
        {
            **test_settings.kafka.client_config(),
            "group.id": f"check-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    events = []
    deadline = time.monotonic() + 15
    while len(events) < 4 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            assert message.key() == DT.encode()
            events.append(ModelUpdate.from_bytes(message.value()))
    consumer.close()
    publisher.close()
    assert sorted((e.version, e.status) for e in events) == [
        (1, "approved"),
        (1, "retired"),
        (2, "approved"),
        (2, "retired"),
    ]
    assert all(e.path.endswith("model.bin") and e.created_at for e in events)
