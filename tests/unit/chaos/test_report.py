"""The chaos report (plots, CSVs and summary.json) from a run's bookkeeping: the samples the
runner keeps a second at a time, the faults, the raw topic's index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from iotwatch.application.chaos import report
from iotwatch.application.chaos.faults import FaultRecord
from iotwatch.application.chaos.resources import Sample, Sampler
from iotwatch.application.chaos.schedule import Action, FaultKind, PlannedFault
from iotwatch.application.harness.accounting import RawIndex
from iotwatch.application.harness.probe import LiveState
from iotwatch.application.harness.probe import Sample as LiveSample

STARTED = 1_800_000_000.0


def test_the_report_is_written_from_the_runs_samples(tmp_path: Path) -> None:
    live = LiveState()
    sampler = Sampler(lambda: {}, STARTED)
    for second in range(60):
        gateway = {"received": 2000.0 * second, "forwarded": 2000.0 * second, "inflight": float(second % 3)}
        live.samples.append(LiveSample(STARTED + second, gateway, 2000 * second, 2000 * max(0, second - 1), second))
        for pid, process in ((10, "gateway"), (11, "stream")):
            sampler.samples.append(Sample(float(second), process, pid, 100_000_000 + second, 40, 12, 90_000_000, 3))
    fault = FaultRecord(PlannedFault(20.0, FaultKind("gateway", Action.KILL), 5.0), 20.0, 25.0, 31.0)
    seqs = np.arange(1000, dtype=np.int64)
    raw = RawIndex(
        ["home-1-thermostat-1"],
        np.zeros(1000, np.int32),
        seqs,
        (STARTED * 1000 + 60 * seqs).astype(np.int64),
        (STARTED * 1000 + 60 * seqs - 5).astype(np.int64),
        {"home-1-thermostat-1": ("thermostat", "home-1")},
        records=1000,
    )

    where = report.write(tmp_path, live, sampler, [fault], STARTED, raw, loss=0)

    assert sorted(Path(p).name for p in where.plots) == ["latency.png", "pipeline.png", "resources.png"]
    resources = pd.read_csv(where.resources_csv)
    assert len(resources) == 120 and set(resources["process"]) == {"gateway", "stream"}
    assert resources["anon_bytes"].iloc[-1] == 90_000_000 and resources["rss_bytes"].max() == 100_000_059
    pipeline = pd.read_csv(where.pipeline_csv)
    assert len(pipeline) == 60 and pipeline["lag"].max() == 2000
    assert where.folder == str(tmp_path)
