"""``iotwatch train``: fit fleet models on the Parquet archive with Spark and register them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pandas as pd

from iotwatch.cli import AppContext, Preset, Working, emit, endpoint_options, json_option, pass_app, seed_option
from iotwatch.errors import IotwatchError
from iotwatch.models.registry import ModelRegistry

__all__ = ["train"]


def _epoch_ms(value: str | None, option: str) -> int | None:
    if value is None:
        return None
    try:
        stamp = pd.Timestamp(value)
    except ValueError as exc:
        raise IotwatchError(f"{option} {value!r} is not a date or ISO timestamp ({exc})") from None
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return int(stamp.value // 1_000_000)


def _render(result: dict[str, Any]) -> None:
    for model in result["models"]:
        if "skipped" in model:
            click.echo(f"{model['device_type']}: skipped ({model['skipped']})")
            continue
        holdout = model["evaluation"]["holdout"]
        click.echo(
            f"{model['device_type']}: {model['detector']} version {model['version']} {model['status']} "
            f"({model['trained_on']['rows']} rows, {model['trained_on']['devices']} devices; "
            f"holdout p99 {holdout.get('p99', '-')}, contamination {holdout.get('contamination', '-')}) "
            f"-> {model['path']}"
        )


@click.command("train")
@click.option(
    "--archive",
    type=click.Path(file_okay=False, path_type=Path),
    help="Archive directory holding readings/ (default: the stream settings' archive_dir).",
)
@click.option(
    "--registry",
    "registry_path",
    type=click.Path(file_okay=False, path_type=Path),
    help="Model registry directory (default: IOTWATCH_REGISTRY_PATH or ~/.iotwatch/registry).",
)
@click.option("--since", metavar="DATE|ISO", help="Train on readings at or after this event time (UTC).")
@click.option("--until", metavar="DATE|ISO", help="Train on readings before this event time (UTC).")
@click.option("--device-type", "device_types", multiple=True, help="Device type to train (repeatable; default all).")
@click.option(
    "--max-rows",
    default=200_000,
    show_default=True,
    type=click.IntRange(min=2),
    help="Cap on training rows per device type (a deterministic sample).",
)
@click.option(
    "--threshold",
    default=0.65,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Score at which the evaluation counts a row as anomalous (contamination figure).",
)
@seed_option(Preset(42, "Seed of the sample and the forest."))
@click.option(
    "--master",
    default="local[2]",
    show_default=True,
    help="Spark master; '' to leave it to spark-submit (ignored under spark-submit anyway).",
)
@click.option("--approve", is_flag=True, help="Approve the new versions and publish model-update events.")
@endpoint_options(kafka=True)
@json_option
@pass_app
def train(
    app: AppContext,
    archive: Path | None,
    registry_path: Path | None,
    since: str | None,
    until: str | None,
    device_types: tuple[str, ...],
    max_rows: int,
    threshold: float,
    seed: int,
    master: str,
    approve: bool,
    as_json: bool,
) -> None:
    """Fit an Isolation Forest per device type on the archived readings (Spark batch job)
    and register each as a candidate model; with --approve, approve it and announce it
    on the model-updates topic so running scorers swap it in."""
    from iotwatch.jvm.spark import session_scope
    from iotwatch.models.training import BATCH_CONF, TrainConfig, train_fleet_models
    from iotwatch.models.updates import UpdatePublisher

    settings = app.settings
    archive = archive or settings.stream.archive_dir
    config = TrainConfig(
        archive=archive,
        since_ms=_epoch_ms(since, "--since"),
        until_ms=_epoch_ms(until, "--until"),
        device_types=device_types,
        max_rows=max_rows,
        threshold=threshold,
        seed=seed,
    )
    if config.since_ms is not None and config.until_ms is not None and config.since_ms >= config.until_ms:
        raise IotwatchError("--since must be before --until")
    if not (archive / "readings").is_dir():
        raise IotwatchError(f"{archive / 'readings'} does not exist: no archive to train on (see --archive)")
    registry = ModelRegistry(registry_path or settings.registry.path)
    with Working("train") as working:
        working.step("starting Spark")
        with session_scope("iotwatch-train", master or None, conf=BATCH_CONF) as spark:
            working.step(f"reading {archive / 'readings'} and fitting a model per device type")
            models = train_fleet_models(spark, config, registry)
    if approve:
        publisher = UpdatePublisher(settings.kafka, settings.topics.model_updates)
        registry.publisher = publisher
        try:
            for model in models:
                if "version" in model:
                    model["status"] = registry.approve(model["device_type"], model["detector"], model["version"]).status
        finally:
            publisher.close()
    result = {"archive": str(archive), "registry": str(registry.root), "approved": approve, "models": models}
    emit(result, as_json, _render)


if __name__ == "__main__":  # spark-submit models/cli.py --archive ... (the master comes from spark-submit)
    train.main(prog_name="iotwatch train", obj=AppContext(None))
