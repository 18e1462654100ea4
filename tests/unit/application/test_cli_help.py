"""Every ``iotwatch`` command, sub-command included, imports and explains itself with --help.

Sub-commands are imported only when used (``iotwatch.application.cli.SUBCOMMANDS``), so a broken
import or a bad option declaration would otherwise surface only when a user runs that
command.
"""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from iotwatch.application.cli import SUBCOMMANDS, cli


def _paths(group: click.Group, ctx: click.Context, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, f"iotwatch {' '.join((*prefix, name))} does not load"
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths += _paths(command, click.Context(command, parent=ctx, info_name=name), (*prefix, name))
    return paths


COMMANDS = _paths(cli, click.Context(cli, info_name="iotwatch"))


def test_every_registered_sub_command_is_walked() -> None:
    assert set(SUBCOMMANDS) <= {path[0] for path in COMMANDS}
    assert any(len(path) > 1 for path in COMMANDS)  # groups' own sub-commands too (bench, alerts...)


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_the_command_shows_its_help(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="iotwatch")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: iotwatch " + " ".join(path))
    command_help = result.output.split("\n\n", 2)
    assert len(command_help) == 3 and command_help[1].strip(), f"iotwatch {' '.join(path)} has no description"
