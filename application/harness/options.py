"""The options every scenario's command takes, declared once for ``iotwatch demo`` and
``iotwatch chaos``: the load (``--duration``, ``--homes``, ``--vehicles``, ``--rate`` where
the simulators are paced), ``--seed``, the run folder ``--out`` and ``--json``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from iotwatch.cli import Preset, compose, json_option, run_folder_option, run_options, seed_option

F = TypeVar("F", bound=Callable[..., Any])


def scenario_options(
    command: str, *, seed: Preset, duration: Preset, homes: Preset, vehicles: Preset, rate: Preset | None = None
) -> Callable[[F], F]:
    """The scenario ``command``'s shared options, with its own defaults and help."""
    return compose(
        run_options(duration=duration, homes=homes, vehicles=vehicles, rate=rate),
        seed_option(seed),
        run_folder_option(command),
        json_option,
    )
