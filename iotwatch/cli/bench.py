"""``iotwatch bench ...``: each benchmark measures a stage against its raw path, same run.

Machines are shared and noisy, so every benchmark reports ratios against a baseline
measured in the same run, never absolute times alone; all print JSON with ``--json``.
"""

from __future__ import annotations

import click

from iotwatch.cli import LazyGroup

#: Benchmark name -> "module:attribute" of its click command (imported when run).
BENCHMARKS: dict[str, str] = {
    "gateway": "gateway.bench:bench_gateway",
    "stream": "streaming.bench:bench_stream",
    "simulate": "devices.bench:bench_simulate",
    "replication": "iotwatch.replication_bench:bench_replication",
}


class _BenchGroup(LazyGroup):
    registry = BENCHMARKS


@click.group(cls=_BenchGroup)
def bench() -> None:
    """Throughput, latency and memory of each stage against its raw path."""
