"""Output that reads well anywhere: a command's table piped to a file or another program keeps
whole rows (rich alone cuts every table to 80 columns when stdout is not a terminal)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from iotwatch.evaluation.sources import NAB_SAMPLE


def test_a_piped_evaluate_table_is_not_cut_to_80_columns(tmp_path: Path) -> None:
    argv = ["evaluate", "--dataset", str(NAB_SAMPLE), "--split", "held_out", "--detector", "robust_zscore"]
    result = subprocess.run(
        [sys.executable, "-m", "iotwatch.application", *argv], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    table = [line for line in result.stdout.splitlines() if line.startswith(("┃", "│"))]
    assert table and max(len(line) for line in table) > 80
    assert "…" not in result.stdout, result.stdout
    header = table[0]
    assert all(name in header for name in ("stream / group", "recall", "precision", "delay rows", "FA/day"))
