"""The option sets several commands share (``iotwatch.cli``): one declaration each, the
command's own default and help, and what the options hand to the command."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from iotwatch.cli import NumberList, Preset, latency_options, run_folder_option, run_options, seed_option


def _params(command: click.Command) -> dict[str, click.Parameter]:
    return {p.name or "": p for p in command.params}


def test_demo_and_chaos_take_the_run_options_with_their_own_defaults_and_help() -> None:
    from iotwatch.application.chaos.cli import chaos
    from iotwatch.application.demo.cli import demo

    demo_params, chaos_params = _params(demo), _params(chaos)
    for name in ("duration", "homes", "vehicles", "seed", "out"):
        a, b = demo_params[name], chaos_params[name]
        assert (a.opts, a.type.name) == (b.opts, b.type.name), name
    assert (demo_params["duration"].default, chaos_params["duration"].default) == (90.0, 600.0)
    assert "rate" not in demo_params and chaos_params["rate"].default == 2000.0
    assert demo_params["seed"].help is None
    assert chaos_params["seed"].help == "Same seed, same fault schedule and devices."


def test_the_benchmarks_latency_runs_share_their_options() -> None:
    from iotwatch.application.bench.gateway import bench_gateway
    from iotwatch.application.bench.stream import bench_stream

    gateway, stream = _params(bench_gateway), _params(bench_stream)
    assert gateway["latency_seconds"].opts == stream["latency_seconds"].opts == ["--latency-seconds"]
    assert (gateway["rate"].default, gateway["rate"].type) == (5000.0, click.FLOAT)
    assert isinstance(stream["rates"].type, NumberList) and stream["rates"].opts == ["--rate"]


def test_the_options_hand_the_command_parsed_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    @click.command()
    @run_options(duration=Preset(5.0), homes=Preset(1), vehicles=Preset(0), rate=Preset(10.0))
    @seed_option(Preset(3))
    @run_folder_option("trial")
    def run(**values: object) -> None:
        seen.update(values)

    @click.command()
    @latency_options(rate=Preset("100,200"), seconds=Preset(2.0), rates=True)
    def latency(**values: object) -> None:
        seen.update(values)

    monkeypatch.setenv("HOME", str(tmp_path))
    runner = CliRunner()
    result = runner.invoke(run, ["--homes", "4"])
    assert result.exit_code == 0, result.output
    out = seen.pop("out")
    assert isinstance(out, Path) and out.is_absolute() and out.parent == tmp_path / ".iotwatch" / "trial"
    assert seen == {"duration": 5.0, "rate": 10.0, "homes": 4, "vehicles": 0, "seed": 3}
    seen.clear()
    assert runner.invoke(run, ["--out", "here"]).exit_code == 0 and seen["out"] == Path("here").resolve()

    seen.clear()
    assert runner.invoke(latency, []).exit_code == 0 and seen == {"rates": [100, 200], "latency_seconds": 2.0}
    assert runner.invoke(latency, ["--rate", "1e3, 2500"]).exit_code == 0 and seen["rates"] == [1000, 2500]
    refused = runner.invoke(latency, ["--rate", "fast"])
    assert refused.exit_code == 2 and "'fast': give comma-separated numbers" in refused.output


def test_a_command_that_works_silently_says_what_it_is_doing_from_its_first_second(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """``Working``: outside a terminal, one log line at the start and one per step, none after
    the work is done; ``iotwatch archive compact`` shows it before its result."""
    import logging

    from click.testing import CliRunner

    from iotwatch.application.cli import cli
    from iotwatch.cli import Working

    with caplog.at_level(logging.INFO, logger="iotwatch"), Working("train") as working:
        working.step("starting Spark")
        working.done()
        working.step("too late")
    assert [r.getMessage() for r in caplog.records] == ["train ...", "train: starting Spark"]
    (tmp_path / "readings").mkdir()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="iotwatch"):
        result = CliRunner().invoke(cli, ["archive", "compact", "--archive", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"compacting {tmp_path} ..." in caplog.messages and "files ->" in result.stdout
