"""The run harness's logic without servers: when a drained pipeline has caught up, and the
results' JSON (keys from the records' fields, optional ones left out)."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

from iotwatch.application.harness.pipeline import CatchUp
from iotwatch.application.harness.probe import Sample
from iotwatch.application.harness.results import as_json, write_summary


def sample(
    raw_end: int, stream_offset: int, inflight: float = 0.0, forwarded: float = 0.0, edge_end: int = 0
) -> Sample:
    return Sample(time.time(), {"inflight": inflight, "forwarded": forwarded}, raw_end, stream_offset, 0, edge_end)


@pytest.mark.parametrize(
    ("not_yet", "why"),
    [
        (sample(100, 100, inflight=3), "the gateway holds messages Kafka has not confirmed"),
        (sample(100, 99), "the job has not committed the raw topic's last records"),
        (sample(100, 100, forwarded=120), "the gateway forwarded records the probe has not seen appended"),
        (sample(100, 100, edge_end=130), "the sites hold records not yet replicated to the centre"),
        (sample(0, 0), "nothing flowed at all"),
    ],
)
def test_a_pipeline_with_work_left_has_not_caught_up(not_yet: Sample, why: str) -> None:
    assert not CatchUp(hold_s=0.0).update(not_yet), why


def test_caught_up_only_after_staying_idle_for_the_hold() -> None:
    waiting = CatchUp(hold_s=60.0)
    assert not waiting.update(sample(100, 100))  # idle, but not for a minute yet
    done = CatchUp(hold_s=0.0)
    assert done.update(sample(100, 100, forwarded=100))
    assert not done.update(sample(120, 100))  # new records: the idle stretch starts again
    assert done.update(sample(120, 120))


class Part(msgspec.Struct, kw_only=True):
    count: int
    where: Path


class Whole(msgspec.Struct, kw_only=True, omit_defaults=True):
    part: Part
    value: np.int64
    extra: dict[str, int] | None = None


def test_results_become_json_with_their_fields_as_keys(tmp_path: Path) -> None:
    """Paths and numpy numbers (what JSON has no type for) are written as text, as the
    summaries always wrote them; a field at its default None is left out."""
    whole = Whole(part=Part(count=3, where=tmp_path), value=np.int64(7))
    assert as_json(whole) == {"part": {"count": 3, "where": str(tmp_path)}, "value": "7"}
    whole.extra = {"a": 1}
    written = write_summary(tmp_path, whole)
    assert written == tmp_path / "summary.json"
    assert msgspec.json.decode(written.read_bytes())["extra"] == {"a": 1}
