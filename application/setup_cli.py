"""``iotwatch setup``: fetch the Java artifacts and compile the job's kernels once, so every
later run works offline and no job compiles during its first micro-batch."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from iotwatch.cli import emit, json_option


@click.command()
@click.option(
    "--jars-from",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Install from a folder of jars downloaded elsewhere (a copy of another machine's "
    "~/.iotwatch/jars, or one folder of jars) instead of resolving them with Maven.",
)
@json_option
def setup(jars_from: Path | None, as_json: bool) -> None:
    """Resolve Apache Kafka's broker, MirrorMaker 2 and Spark's Kafka connector from Maven Central,
    and build the upstream fixes the pinned Spark release needs (iotwatch.jvm.spark_patches).

    Each is resolved once with Maven into its own folder under ~/.iotwatch/jars (or
    IOTWATCH_JARS_DIR); a folder already there is kept, so running this again needs no network.
    Then compile the streaming job's numba kernels into numba's cache (about 30 s the first
    time; a few seconds to load them afterwards).
    """
    from iotwatch.jvm.jars import all_sets, install
    from iotwatch.jvm.spark_patches import patches_needed

    result = {}
    for jar_set in all_sets():
        already = jar_set.installed()
        folder = install(jar_set, jars_from=jars_from)
        result[jar_set.name] = {
            "coordinates": list(jar_set.coordinates),
            "folder": str(folder),
            "jars": len(jar_set.jars()),
            "fetched": not already,
        }
    if patches_needed():
        result["spark-patches"] = _spark_patches(jars_from)
    result["kernels"] = _compile_kernels()
    emit(result, as_json, _render)


def _compile_kernels() -> dict[str, Any]:
    """Compile the job's kernels now (or load them from numba's cache when they are there)."""
    from iotwatch.streaming.worker_daemon import compile_job

    started = time.perf_counter()
    compile_job()
    return {"seconds": round(time.perf_counter() - started, 1)}


def _spark_patches(jars_from: Path | None) -> dict[str, Any]:
    """Build the pinned Spark release's fixes (from Maven, or from ``jars_from``: a copy of
    another machine's ``spark-patches-<version>-<digest>`` folder or spark-sql's sources jar). A fix
    that cannot be built is reported, not fatal: the job runs without it, with the bug."""
    from iotwatch.errors import StackError
    from iotwatch.jvm.spark_patches import build_patches, install_built, patch_jar, patches_needed

    issues = ", ".join(p.issue for p in patches_needed())
    already = patch_jar() is not None
    try:
        jar = install_built(jars_from) if jars_from else build_patches()
    except StackError as exc:
        click.echo(f"setup: Spark's fixes ({issues}) not built: {exc}", err=True)
        jar = None
    return {
        "coordinates": [issues],
        "folder": str(jar.parent) if jar else "",
        "jars": 1 if jar else 0,
        "fetched": jar is not None and not already,
    }


def _render(result: dict[str, dict[str, Any]]) -> None:
    for name, entry in result.items():
        if name == "kernels":
            click.echo(f"{name:<16}compiled or loaded from numba's cache in {entry['seconds']} s")
            continue
        how = ("built" if name == "spark-patches" else "fetched") if entry["fetched"] else "already there"
        coordinate = entry["coordinates"][0]
        click.echo(f"{name:<16}{coordinate:<52}{entry['jars']:>3} jars in {entry['folder']} ({how})")
