"""A run's results as JSON, in one place: the summary a scenario prints with ``--json`` and writes to
its report folder as ``summary.json`` (docs/internals.md, "Harness results")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec


def as_json(result: object) -> Any:
    """``result`` as JSON's types: a dataclass as an object of its fields; what JSON has no
    type for (a path, a numpy number) as its text."""
    return msgspec.to_builtins(result, enc_hook=str)


def write_summary(folder: Path, summary: object) -> Path:
    """``summary.json`` in ``folder``."""
    path = folder / "summary.json"
    path.write_text(msgspec.json.format(msgspec.json.encode(as_json(summary)), indent=2).decode())
    return path


def save_figure(fig: Any, path: Path) -> Path:
    """A report's plot as a PNG at ``path``, its figure closed (a run draws many)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
