"""A micro-batch a crash interrupted is planned anew by the next start, not run again alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from iotwatch.streaming.checkpoint import drop_interrupted_batch


def _checkpoint(folder: Path, offsets: range, commits: range) -> Path:
    for log, batches in (("offsets", offsets), ("commits", commits)):
        (folder / log).mkdir(parents=True)
        for batch in batches:
            (folder / log / str(batch)).write_text("v1\n")
            (folder / log / f".{batch}.crc").write_text("")
    return folder


def test_the_offsets_of_the_one_uncommitted_batch_are_dropped_with_their_checksum(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path, range(8), range(7))
    assert drop_interrupted_batch(checkpoint) == 7
    assert sorted(p.name for p in (checkpoint / "offsets").iterdir()) == sorted(
        [*map(str, range(7)), *(f".{b}.crc" for b in range(7))]
    )


@pytest.mark.parametrize(
    ("offsets", "commits"),
    [(range(8), range(8)), (range(1), range(0)), (range(0), range(0)), (range(9), range(7))],
    ids=["all committed", "first batch", "new checkpoint", "not Spark's one uncommitted batch"],
)
def test_nothing_is_dropped_unless_exactly_the_newest_batch_is_uncommitted(
    tmp_path: Path, offsets: range, commits: range
) -> None:
    checkpoint = _checkpoint(tmp_path, offsets, commits)
    assert drop_interrupted_batch(checkpoint) is None
    assert len(list((checkpoint / "offsets").glob("[0-9]*"))) == len(offsets)


def test_the_state_versions_the_interrupted_batch_wrote_go_and_nothing_else(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path, range(8), range(7))
    kept = ["6.changelog", ".6.changelog.crc", "1.zip", "7.changelog", "SSTs/000008-ab12.sst", "_metadata/v2/8"]
    dropped = ["8.changelog", ".8.changelog.crc", "8.zip", ".8.zip.crc", "8_4f2e-aa01.changelog"]
    for partition in ("0", "3"):
        for name in kept + dropped:
            path = checkpoint / "state" / "0" / partition / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
    (checkpoint / "state" / "0" / "_stateSchema").mkdir()
    (checkpoint / "state" / "0" / "_stateSchema" / "8_4f2e-aa01").write_text("")

    assert drop_interrupted_batch(checkpoint) == 7  # batch 7 wrote the state's version 8

    left = {p.relative_to(checkpoint / "state").as_posix() for p in (checkpoint / "state").rglob("*") if p.is_file()}
    schema = "0/_stateSchema/8_4f2e-aa01"
    assert left == {f"0/{partition}/{name}" for partition in ("0", "3") for name in kept} | {schema}
