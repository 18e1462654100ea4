"""The demo's judgement of its alerts and its pick of the device the dashboards are checked on
(no servers: constructed alerts and readings)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from iotwatch.application.demo.detection import judge_alerts
from iotwatch.application.demo.runner import pick_values
from iotwatch.application.harness.accounting import RawIndex, account, archived_seqs, index_raw
from iotwatch.application.harness.results import as_json
from iotwatch.contract.alerts import AlertRecord
from iotwatch.evaluation.judgement import END_OF_RUN, FALSE_ALARM, RELATED, TRUE
from tests.helpers import injection


def alert(alert_id: str, device: str, rule: str, first_seq: int, seq: int | None = None, **fields: Any) -> AlertRecord:
    return msgspec.convert(
        {
            "alert_id": alert_id,
            "state": "raised",
            "severity": "major",
            "detector": "rule",
            "device_id": device,
            "device_type": "thermostat",
            "site": "h",
            "rule": rule,
            "score": 1.0,
            "first_seq": first_seq,
            "seq": first_seq if seq is None else seq,
            "first_event_ms": 1_700_000_000_000 + first_seq * 1000,
            "detected_at_ms": 1_700_000_000_000 + first_seq * 1000,
            "message": rule,
            **fields,
        },
        AlertRecord,
    )


def test_the_demo_reports_the_one_judgement_and_the_end_of_the_run() -> None:
    """The demo judges by :func:`iotwatch.evaluation.judgement.judge`; its summary adds up and
    every device's silence when the simulators stop is the end of the run."""
    t2 = np.setdiff1d(np.arange(900), np.arange(300, 351))
    raw = RawIndex(
        devices=["t1", "t2"],
        device=np.repeat(np.array([0, 1], np.int32), [900, len(t2)]),
        seq=np.concatenate([np.arange(900), t2]),
        identities={"t1": ("thermostat", "h"), "t2": ("thermostat", "h")},
    )
    truth = [injection("dropout", "t2", 300, 350)]
    alerts = [
        alert("silence", "t2", "device_silent", 299),
        alert("stray", "t1", "anomaly_score", 600),
        alert("stopped", "t1", "device_silent", 899),
        alert("silence", "t2", "device_silent", 299, state="cleared"),
        # the responder's escalation has no reading of its own: it is judged at its original's
        msgspec.structs.replace(
            alert("escalated", "t2", "command_escalation", 0, caused_by="silence"), seq=None, first_seq=None
        ),
    ]
    detection, verdicts = judge_alerts(alerts, truth, raw, speedup=10.0)
    summary = as_json(detection)  # the summary's keys
    assert verdicts == {"silence": TRUE, "stray": FALSE_ALARM, "stopped": END_OF_RUN, "escalated": RELATED}
    assert (summary["recall"], summary["precision"], summary["alerts_raised"]) == (1.0, 0.5, 4)
    assert (summary["alerts_detecting_an_anomaly"], summary["false_alarms"], summary["end_of_run_silences"]) == (
        1,
        1,
        1,
    )
    assert summary["by_kind"]["dropout"] == {"injected": 1, "detected": 1, "recall": 1.0, "median_delay_s": None}


def test_dashboards_are_checked_on_a_device_that_was_sent_a_command() -> None:
    """The device dashboard annotates commands: the demo checks it on a device that had one
    (so that query can return data), else on one whose alert matched an injected anomaly."""
    identities = {"h-door": ("door_sensor", "h"), "h-leak": ("leak_sensor", "h"), "car": ("vehicle_edr", "road")}
    alerts = [
        alert("door", "h-door", "anomaly_score", 10, metric="temperature_c"),
        alert("leak", "h-leak", "water_leak", 20, metric="water_detected"),
    ]
    verdicts = {"door": TRUE, "leak": TRUE}
    picked = pick_values(alerts, verdicts, identities, frozenset({"h-leak", "car"}))
    assert picked is not None and (picked.device, picked.metric, picked.vehicles) == (
        "h-leak",
        "water_detected",
        ["car"],
    )
    picked = pick_values(alerts, {"door": TRUE, "leak": FALSE_ALARM}, identities)
    assert picked is not None and (picked.device, picked.site) == ("h-door", "h")


@dataclass
class Record:
    """A raw topic record as :func:`index_raw` reads it (value and append time)."""

    body: bytes
    appended_ms: int

    def value(self) -> bytes:
        return self.body

    def timestamp(self) -> tuple[int, int]:
        return (1, self.appended_ms)  # TIMESTAMP_CREATE_TIME


def reading(device: str, seq: int, appended_ms: int, ts: object = None) -> Record:
    body = {"device_id": device, "seq": seq, "device_type": "thermostat", "site": "h", "ts": ts or 1000 + seq}
    return Record(json.dumps(body).encode(), appended_ms)


def test_the_raw_index_keeps_each_readings_first_copy_in_columns() -> None:
    """Copies (at-least-once) count as records, not readings; the first copy read gives the
    append time; whatever is not a reading is counted as unparseable, however odd."""
    batches = [
        [reading("b", 2, 20), reading("a", 0, 10), reading("b", 0, 11)],
        [reading("b", 2, 99), Record(b"not json", 5), reading("a", 1, 12), reading("x", 2**70, 13)],
        [reading("a", 5, 14, ts="yesterday"), Record(b'{"device_id": "a"}', 15), reading("a", 3, 16)],
    ]
    raw = index_raw(batches)
    assert (raw.records, raw.unparseable, raw.readings) == (10, 4, 5)
    assert {device: seqs.tolist() for device, seqs in raw.seqs().items()} == {"a": [0, 1, 3], "b": [0, 2]}
    assert raw.last_seq() == {"a": 3, "b": 2}
    assert (raw.appended_at("b", 2), raw.appended_at("a", 3), raw.appended_at("a", 2), raw.appended_at("z", 0)) == (
        20,
        16,
        None,
        None,
    )
    assert raw.identities == {"b": ("thermostat", "h"), "a": ("thermostat", "h")}
    assert index_raw([]).seqs() == {}


def test_loss_counts_every_missing_seq_at_the_transport_and_in_the_pipeline() -> None:
    """A gap the ground truth does not declare is transport loss; a reading in the raw topic
    that is neither archived nor dead-lettered as late is pipeline loss. Every one counts
    (the report lists the first 20 a device)."""
    raw = {"t1": np.setdiff1d(np.arange(100), [10, 50, 51, 52]), "t2": np.arange(30)}
    archived = {"t1": np.setdiff1d(raw["t1"], np.arange(60, 90)), "t2": np.arange(30)}
    truth = [injection("dropout", "t1", 50, 52)]
    loss = account(raw, archived, {"t1": set(range(60, 65))}, truth)
    assert loss.transport_gaps == {"t1": [10]}
    assert loss.pipeline_missing == {"t1": list(range(65, 85))}
    assert (loss.loss, loss.unique_readings_in_kafka, loss.archived, loss.late) == (1 + 25, 126, 96, 5)
    assert loss.declared_dropout_or_malformed_seqs == 3


def test_archived_seqs_reads_every_file_of_the_archive(tmp_path: Path) -> None:
    """Device -> sorted unique seqs over the archive's partitions (a replayed batch archives
    a reading twice)."""
    for folder, devices, seqs in [
        ("date=2026-11-27/device_type=thermostat", ["t1", "t2", "t1"], [3, 1, 1]),
        ("date=2026-11-28/device_type=thermostat", ["t1", "t1"], [2, 3]),
        ("date=2026-11-27/device_type=smart_meter", ["m1"], [0]),
    ]:
        (tmp_path / "readings" / folder).mkdir(parents=True)
        table = pa.table({"device_id": devices, "seq": pa.array(seqs, pa.int64()), "site": ["h"] * len(seqs)})
        pq.write_table(table, tmp_path / "readings" / folder / "part-0.parquet")
    archived = archived_seqs(tmp_path)
    assert {device: seqs.tolist() for device, seqs in archived.items()} == {"t1": [1, 2, 3], "t2": [1], "m1": [0]}
    assert archived_seqs(tmp_path / "nothing") == {}
