"""``iotwatch bench ...``: each benchmark measures a stage against its raw path, same run.

Machines are shared and noisy, so every benchmark reports ratios against a baseline
measured in the same run, never absolute times alone; all print JSON with ``--json``.
"""

from __future__ import annotations

import click

from iotwatch.cli import LazyGroup

#: Benchmark name -> "module:attribute" of its click command (imported when run).
BENCHMARKS: dict[str, str] = {
    "gateway": "iotwatch.application.bench.gateway:bench_gateway",
    "stream": "iotwatch.application.bench.stream:bench_stream",
    "simulate": "iotwatch.application.bench.simulate:bench_simulate",
    "replication": "iotwatch.application.bench.replication:bench_replication",
}


class _BenchGroup(LazyGroup):
    registry = BENCHMARKS


@click.group(cls=_BenchGroup, context_settings={"show_default": True})
def bench() -> None:
    """Throughput, latency and memory of each stage against its raw path."""
