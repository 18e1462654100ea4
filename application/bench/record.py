"""Run one ``iotwatch bench`` command (or an ``iotwatch chaos`` or ``iotwatch demo`` run) and keep its JSON result
as a file under ``results/``.

    python application/bench/record.py stream [bench options...]
    python application/bench/record.py gateway --processes 2
    python application/bench/record.py chaos --duration 600
    python application/bench/record.py demo

A chaos run that fails a proof (exit 1) is kept too: its JSON says which proof failed.

The file (``results/<UTC date>-<bench>-<n>.json``) holds the command, the git commit, a
description of the machine (cores, memory, CPU model, load average when it started) and the
bench's own JSON, so every figure the documentation quotes can be traced to a run.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
#: Runs recorded that are commands of their own rather than ``iotwatch bench`` benches.
COMMANDS = {"chaos": ["iotwatch", "chaos"], "demo": ["iotwatch", "demo"]}


def machine() -> dict[str, object]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=RESULTS.parent)
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=RESULTS.parent)
    return out.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    bench, options = argv[0], argv[1:]
    command = [*COMMANDS.get(bench, ["iotwatch", "bench", bench]), *options, "--json"]
    started = dt.datetime.now(dt.UTC)
    record: dict[str, Any] = {
        "bench": bench,
        "command": " ".join(command),
        "started": started.isoformat(timespec="seconds"),
    }
    record.update(commit=commit(), machine=machine())
    run = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    kept_when_failing = bench in COMMANDS and "\n{" in f"\n{run.stdout}"
    if run.returncode != 0 and not kept_when_failing:
        print(f"record: {' '.join(command)} failed with exit {run.returncode}", file=sys.stderr)
        return run.returncode
    record["exit_status"] = run.returncode
    record["result"] = json.loads(
        run.stdout[run.stdout.index("\n{") + 1 :] if not run.stdout.startswith("{") else run.stdout
    )
    RESULTS.mkdir(exist_ok=True)
    day = started.date().isoformat()
    taken = [int(p.stem.rsplit("-", 1)[1]) for p in RESULTS.glob(f"{day}-{bench}-*.json")]  # (some may be removed)
    path = RESULTS / f"{day}-{bench}-{max(taken, default=0) + 1}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(path)
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
