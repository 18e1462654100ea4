"""The README's "Command line" section shows what the commands print (the same code makes both)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.test_cli_mistakes import run_iotwatch


def command_line_section() -> str:
    text = (REPO_ROOT / "README.md").read_text()
    return text[text.index("## Command line") : text.index("## Full deployment")]


def test_the_error_lines_shown_are_what_the_commands_print(tmp_path: Path) -> None:
    section = command_line_section()
    for argv in (
        ["alerts", "tail", "--kafka", "localhost:99999"],
        ["alerts", "tail", "--kafka", "127.0.0.1:1", "--timeout", "1"],
        ["simulate", "--anomalies", "crash", "--anomaly-rate", "2", "--vehicles", "0", "--duration", "60"],
    ):
        result = run_iotwatch(argv, tmp_path)
        assert result.stderr.strip() in section, result.stderr


def test_the_score_csv_lines_shown_are_what_it_prints(tmp_path: Path) -> None:
    rows = ["timestamp,value", "2024-01-01 00:00:00,1.0", "2024-01-01 00:05:00,2.0", "2024-01-01 00:03:00,3.0"]
    for last in ("2024-01-01 00:10:00,4.0", "2024-01-01 00:10:00,n/a"):  # out of order (scored); not a number
        (tmp_path / "in.csv").write_text("\n".join([*rows, last]) + "\n")
        result = run_iotwatch(["score-csv", "in.csv", "out.csv"], tmp_path, cwd=tmp_path)
        shown = [line for line in result.stderr.strip().splitlines() if " WARNING " not in line]  # the warm-up
        assert shown and all(line in command_line_section() for line in shown), result.stderr


def test_progress_stop_summary_and_stack_lines_have_the_shape_the_code_prints() -> None:
    from streaming.progress import progress_line

    section = command_line_section()
    assert progress_line(1, 8380, 1798.3, 0, 4660) in section
    assert re.search(r"^stop it with: iotwatch stack down --run-dir \S+$", section, re.M)
    assert re.search(r"^iotwatch stream: stopped after \d+ micro-batches$", section, re.M)
    assert re.search(r"^seq: every device started at 0; the next run carries on from \S+$", section, re.M)
    assert "this run is scored like the\nfirst" in section or "this run is scored like the first" in section
