"""The README and the documentation pages show commands that run as printed: every
``iotwatch ...`` line in their shell blocks names commands and options that exist, and the
output they show is what the commands print (the same code makes both)."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import click

from iotwatch.application.cli import cli
from tests.conftest import REPO_ROOT
from tests.unit.application.test_cli_mistakes import run_iotwatch

DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"^```(sh|console|bash)\n(.*?)^```", re.M | re.S)


def documents_text() -> str:
    return "\n".join(path.read_text() for path in DOCUMENTS)


def shown_commands(text: str) -> list[list[str]]:
    """The argument lists after ``iotwatch`` of every command in the shell blocks of ``text``."""
    commands = []
    for kind, body in _BLOCK.findall(text):
        lines = body.replace("\\\n", " ").splitlines()
        if kind == "console":
            lines = [line[2:] for line in lines if line.startswith("$ ")]
        for line in lines:
            for part in line.split(" · "):
                words = shlex.split(part, comments=True)
                if "iotwatch" in words:
                    rest = words[words.index("iotwatch") + 1 :]
                    commands.append([w for w in rest[: next((i for i, w in enumerate(rest) if w in "&|;"), None)]])
    return commands


def _options(command: click.Command) -> set[str]:
    names = {"-h", "--help"}
    for param in command.params:
        names.update(param.opts, param.secondary_opts)
    return names


def check_command(words: list[str]) -> None:
    """Raise AssertionError when ``words`` names a command or an option that does not exist."""
    command: click.Command = cli
    ctx = click.Context(cli, info_name="iotwatch")
    words = [w.strip("[]|") for w in words]
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        sub = command.get_command(ctx, words[0])
        assert sub is not None, f"iotwatch has no command {words[0]!r} ({' '.join(words)})"
        command, words = sub, words[1:]
    known = _options(command) | (_options(cli) if command is cli else set())
    for word in words:
        if word.startswith("-") and word not in ("-", "--"):
            for option in word.split("=", 1)[0].split("/"):
                assert option in known, f"`{command.name}` has no option {option!r}"


def test_every_command_shown_names_real_commands_and_options() -> None:
    checked = 0
    for path in DOCUMENTS:
        for words in shown_commands(path.read_text()):
            try:
                check_command(words)
            except AssertionError as exc:
                raise AssertionError(f"{path.relative_to(REPO_ROOT)}: iotwatch {' '.join(words)}: {exc}") from None
            checked += 1
    assert checked > 60, checked


def test_every_python_command_shown_names_a_module_or_script_that_exists() -> None:
    shown = [line for _, body in _BLOCK.findall(documents_text()) for line in body.splitlines()]
    modules = [m for line in shown for m in re.findall(r"^python -m ([\w.]+)", line)]
    scripts = [s for line in shown for s in re.findall(r"^python (\S+\.py)", line)]
    assert modules and scripts
    for module in modules:
        assert importlib.util.find_spec(module) is not None, f"python -m {module}: no such module"
    for script in scripts:
        assert (REPO_ROOT / script).is_file(), f"python {script}: no such file"


def test_the_readme_stays_short_and_starts_with_the_two_commands() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 350
    first_block = _BLOCK.search(readme)
    assert first_block is not None
    assert [line.split("#")[0].strip() for line in first_block.group(2).splitlines()] == [
        "./bootstrap.sh",
        "./bootstrap.sh pytest",
    ]


def test_a_misspelt_command_or_option_is_caught() -> None:
    for text in ("```sh\niotwatch simulate --homse 3\n```\n", "```console\n$ iotwatch alerts acknowledge X\n```\n"):
        (words,) = shown_commands(text)
        try:
            check_command(words)
        except AssertionError:
            continue
        raise AssertionError(f"not caught: {words}")


def test_the_error_lines_shown_are_what_the_commands_print(tmp_path: Path) -> None:
    shown = documents_text()
    for argv in (
        ["alerts", "tail", "--kafka", "localhost:99999"],
        ["alerts", "tail", "--kafka", "127.0.0.1:1", "--timeout", "1"],
        ["simulate", "--anomalies", "crash", "--anomaly-rate", "2", "--vehicles", "0", "--duration", "60"],
    ):
        result = run_iotwatch(argv, tmp_path)
        assert result.stderr.strip() in shown, result.stderr


def test_the_score_csv_lines_shown_are_what_it_prints(tmp_path: Path) -> None:
    rows = ["timestamp,value", "2024-01-01 00:00:00,1.0", "2024-01-01 00:05:00,2.0", "2024-01-01 00:03:00,3.0"]
    shown_text = documents_text()
    for last in ("2024-01-01 00:10:00,4.0", "2024-01-01 00:10:00,n/a"):  # out of order (scored); not a number
        (tmp_path / "in.csv").write_text("\n".join([*rows, last]) + "\n")
        result = run_iotwatch(["score-csv", "in.csv", "out.csv"], tmp_path, cwd=tmp_path)
        shown = [line for line in result.stderr.strip().splitlines() if " WARNING " not in line]  # the warm-up
        assert shown and all(line in shown_text for line in shown), result.stderr


def test_progress_stop_summary_and_stack_lines_have_the_shape_the_code_prints() -> None:
    from iotwatch.streaming.progress import progress_line

    text = documents_text()
    assert progress_line(1, 8380, 1798.3, 0, 4660) in text
    assert re.search(r"^stop it with: iotwatch stack down --run-dir \S+$", text, re.M)
    assert re.search(r"^iotwatch stream: stopped after \d+ micro-batches$", text, re.M)
    assert re.search(r"^seq: every device started at 0; the next run carries on from \S+$", text, re.M)
    assert "this run is scored like the\nfirst" in text or "this run is scored like the first" in text
