"""``iotwatch train`` on a small generated Parquet archive, part of it compacted, with real Spark
and the real broker."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, TopicPartition

from iotwatch.application.cli import cli
from iotwatch.contract.model_updates import ModelUpdate
from iotwatch.models.registry import ModelRegistry
from iotwatch.settings import Settings
from iotwatch.streaming.archive_compaction import compact
from iotwatch.streaming.sinks.archive import ARCHIVE_SCHEMA, file_name

pytestmark = pytest.mark.slow

DAY_MS = 86_400_000
T0 = 1_735_689_600_000  # 2025-01-01T00:00:00Z
STEP = 60_000
METRICS = {"thermostat": ("humidity_pct", "temperature_c"), "meter": ("power_w",)}


def _write_archive(root: Path, rows_per_device: int = 400) -> dict[str, int]:
    """Two days, two device types, three devices each, as the streaming job writes its archive
    (one row per reading, metrics as a struct of the wide layout, two files per folder named by
    Kafka partition and offsets; a few readings with an out-of-range value); returns
    (device, event) rows in range per type."""
    from iotwatch.streaming.schemas import SCORED_METRICS, WIDE_METRICS

    rng = np.random.default_rng(0)
    in_range: dict[str, int] = {}
    offset = 0
    for device_type, metrics in METRICS.items():
        for day in range(2):
            frames = []
            for d in range(3):
                i = np.arange(rows_per_device)
                event_ms = T0 + day * DAY_MS + i * STEP
                bad = i % 50 == 7
                values = {
                    m: np.where(bad, 1e6, 20.0 + 10 * k + rng.normal(0, 1, len(i))) for k, m in enumerate(metrics)
                }
                frames.append(
                    pd.DataFrame(
                        {
                            "device_id": f"{device_type}-{d}",
                            "site": "site-1",
                            "seq": i.astype("int64"),
                            "event_ms": event_ms.astype("int64"),
                            "event_time": pd.to_datetime(event_ms, unit="ms", utc=True),
                            "metrics": [
                                {m: float(values[m][j]) if m in values else None for m in WIDE_METRICS}
                                for j in range(len(i))
                            ],
                            "scores": [{m: 0.0 if m in values else None for m in SCORED_METRICS} for _ in i],
                            "out_of_range": [list(metrics) if b else None for b in bad],
                            "extra_metrics": None,
                            "extra_scores": None,
                            "detector": "tail_ensemble",
                        }
                    )
                )
            frame = pd.concat(frames, ignore_index=True)
            date = pd.Timestamp(T0 + day * DAY_MS, unit="ms").strftime("%Y-%m-%d")
            folder = root / "readings" / f"date={date}" / f"device_type={device_type}"
            folder.mkdir(parents=True)
            shuffled = frame.sample(frac=1.0, random_state=day)
            for part in (shuffled.iloc[: len(shuffled) // 2], shuffled.iloc[len(shuffled) // 2 :]):
                table = pa.Table.from_pandas(part, schema=ARCHIVE_SCHEMA, preserve_index=False)
                pq.write_table(table, folder / file_name(0, offset, offset + len(part) - 1))
                offset += len(part)
            if day == 1:  # only the second day is in the --since range
                ok = frame[frame["out_of_range"].isna()]
                in_range[device_type] = len(ok[["device_id", "event_ms"]].drop_duplicates())
    return in_range


def _compact_thermostats(archive: Path) -> None:
    """Compact the thermostats' folders (their files made an hour old) and leave the meters'
    as the job wrote them, so training reads both kinds of file."""
    hour_ago = time.time() - 3700
    for path in (archive / "readings").glob("date=*/device_type=thermostat/*.parquet"):
        os.utime(path, (hour_ago, hour_ago))
    result = compact(archive, min_age_s=3600).to_dict()
    assert (result["files_merged"], result["files_written"], result["files_after"]) == (4, 2, 6), result


def test_train_registers_approves_and_announces(
    tmp_path: Path, test_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_range = _write_archive(tmp_path / "archive")
    _compact_thermostats(tmp_path / "archive")
    topic = test_settings.topics.model_updates
    monkeypatch.setenv("IOTWATCH_TOPIC_MODEL_UPDATES", topic)
    registry_dir = tmp_path / "registry"
    result = CliRunner().invoke(
        cli,
        [
            "train",
            "--archive",
            str(tmp_path / "archive"),
            "--registry",
            str(registry_dir),
            "--since",
            "2025-01-02",
            "--until",
            "2025-01-03",
            "--max-rows",
            "500",
            "--approve",
            "--kafka",
            test_settings.kafka.bootstrap_servers,
            "--json",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output[result.output.index("{") :])
    models = {m["device_type"]: m for m in doc["models"]}
    assert set(models) == {"meter", "thermostat"}
    for device_type, model in models.items():
        assert (model["detector"], model["version"], model["status"]) == ("isolation_forest", 1, "approved")
        trained = model["trained_on"]
        assert trained["devices"] == 3 and trained["eligible_rows"] == in_range[device_type]
        assert 0 < trained["rows"] <= 500
        assert T0 + DAY_MS <= trained["from_ms"] <= trained["to_ms"] < T0 + 2 * DAY_MS
        holdout = model["evaluation"]["holdout"]
        assert 0 < holdout["rows"] <= 125 and 0.0 <= holdout["p50"] <= holdout["p99"] <= holdout["max"] <= 1.0
        assert model["evaluation"]["metrics"] == list(METRICS[device_type])
        assert holdout["contamination"] < 0.2  # clean data: out_of_range rows were left out

    registry = ModelRegistry(registry_dir)
    detector = registry.load(registry.latest_approved("thermostat", "isolation_forest"))
    frame = pd.DataFrame({"humidity_pct": [20.0, 20.0], "temperature_c": [30.0, 80.0]})
    normal, wild = detector.score_many(frame)
    assert wild > normal

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
    events: list[ModelUpdate] = []
    deadline = time.monotonic() + 15
    while len(events) < 2 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            events.append(ModelUpdate.from_bytes(message.value()))
    consumer.close()
    assert sorted((e.device_type, e.version, e.status) for e in events) == [
        ("meter", 1, "approved"),
        ("thermostat", 1, "approved"),
    ]


def test_train_errors_are_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["train", "--archive", str(tmp_path / "none"), "--registry", str(tmp_path)])
    assert result.exit_code != 0 and "does not exist" in str(result.exception)
