"""Batch training of fleet models from the Parquet archive, with Spark.

The streaming job archives one row per scored reading
(:data:`iotwatch.streaming.sinks.archive.ARCHIVE_SCHEMA`; docs/operate/streaming.md has the
layout). For each device type this job takes the in-range metric values of the readings in
the time range, as one row per ``(device_id, event_ms)`` with one column per metric, carries
each metric forward within a device (as the streaming scorer does) and adds the device's
previous reading, so the change features are right even on a random sample.
Rows are split deterministically by a hash of ``(device_id, event_ms)``: one in ten is
held out. An :class:`iotwatch.models.iforest.IsolationForest` is fitted on at most ``max_rows``
training rows (a deterministic hash-ordered sample) and scored on the held-out rows for
the evaluation figures, then registered as a candidate in the registry.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from iotwatch.errors import IotwatchError
from iotwatch.models.iforest import IsolationForest
from iotwatch.models.registry import ModelRegistry, ModelVersion, TrainedOn
from iotwatch.stats import quantiles

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BATCH_CONF", "TrainConfig", "evaluation_figures", "train_fleet_models"]

log = logging.getLogger(__name__)

#: Quantiles of the anomaly score reported in the evaluation figures.
QUANTILES = (0.5, 0.9, 0.99, 0.999)
#: One row in this many is held out for evaluation (by a hash of device and event time).
HOLDOUT_EVERY = 10


@dataclass(frozen=True)
class TrainConfig:
    """What to train on and how."""

    archive: Path
    since_ms: int | None = None
    until_ms: int | None = None
    device_types: Sequence[str] = ()
    max_rows: int = 200_000
    threshold: float = 0.65
    n_estimators: int = 100
    max_samples: int = 256
    seed: int = 42
    params: dict[str, Any] = field(default_factory=dict)


#: Spark settings of the batch jobs (partition values stay strings: dates, device types).
BATCH_CONF = {"spark.sql.sources.partitionColumnTypeInference.enabled": "false"}


def _date(ms: int) -> str:
    return str(np.datetime64(int(ms), "ms").astype("datetime64[D]"))


def _readings(spark: SparkSession, config: TrainConfig) -> DataFrame:
    """The archive's in-range metric values in the time range, in long format
    (device_type, device_id, event_ms, metric, value)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    root = config.archive / "readings"
    if not root.is_dir():
        raise IotwatchError(f"{root} does not exist: no archive to train on (see --archive)")
    df = spark.read.option("basePath", str(root)).parquet(str(root))
    missing = {"device_id", "event_ms", "metrics", "out_of_range", "device_type", "date"} - set(df.columns)
    if missing:
        raise IotwatchError(f"{root} is not a readings archive: missing columns {', '.join(sorted(missing))}")
    if config.since_ms is not None:
        df = df.where((F.col("date") >= _date(config.since_ms)) & (F.col("event_ms") >= config.since_ms))
    if config.until_ms is not None:
        df = df.where((F.col("date") <= _date(config.until_ms)) & (F.col("event_ms") < config.until_ms))
    if config.device_types:
        df = df.where(F.col("device_type").isin(list(config.device_types)))
    metrics = df.schema["metrics"].dataType
    if not isinstance(metrics, StructType):
        raise IotwatchError(f"{root} is not a readings archive: its metrics column is a {metrics.simpleString()}")
    names = [field.name for field in metrics.fields]
    catalogued = F.map_from_arrays(
        F.array(*[F.lit(n) for n in names]), F.array(*[F.col(f"metrics.`{n}`") for n in names])
    )
    extras = (
        F.coalesce(F.col("extra_metrics"), F.create_map().cast("map<string,double>"))
        if "extra_metrics" in df.columns
        else F.create_map().cast("map<string,double>")
    )
    oor = F.coalesce(F.col("out_of_range"), F.array().cast("array<string>"))
    in_range = F.map_filter(
        F.map_concat(catalogued, extras), lambda k, v: v.isNotNull() & ~F.isnan(v) & ~F.array_contains(oor, k)
    )
    return df.select(
        "device_type", "device_id", F.col("event_ms").cast("long"), F.explode(in_range).alias("metric", "value")
    )


def _wide(long: DataFrame, metrics: list[str]) -> DataFrame:
    """One row per (device_id, event_ms): metrics carried forward, plus ``prev__<metric>``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    columns: list[bool | float | int | str] = list(metrics)
    wide = long.groupBy("device_id", "event_ms").pivot("metric", columns).agg(F.avg("value"))
    order = Window.partitionBy("device_id").orderBy("event_ms")
    upto = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    filled = wide.select(
        "device_id", "event_ms", *(F.last(F.col(f"`{m}`"), ignorenulls=True).over(upto).alias(m) for m in metrics)
    )
    with_prev = filled.select("*", *(F.lag(F.col(f"`{m}`")).over(order).alias(f"prev__{m}") for m in metrics))
    bucket = F.pmod(F.xxhash64("device_id", "event_ms"), F.lit(HOLDOUT_EVERY))
    return with_prev.withColumn("_holdout", bucket == 0)


def _sample(wide: DataFrame, holdout: bool, rows: int, seed: int) -> pd.DataFrame:
    """At most ``rows`` rows of one split, chosen by a seeded hash (deterministic), as pandas."""
    from pyspark.sql import functions as F

    part = wide.where(F.col("_holdout") == F.lit(holdout)).drop("_holdout")
    ranked = part.orderBy(F.xxhash64("device_id", "event_ms", F.lit(seed)), "device_id", "event_ms")
    return ranked.limit(rows).toPandas().sort_values(["device_id", "event_ms"], kind="stable").reset_index(drop=True)


def evaluation_figures(scores: np.ndarray, threshold: float) -> dict[str, Any]:
    """Score quantiles and the share of rows at or above ``threshold``.

    >>> evaluation_figures(np.array([0.4, 0.5, 0.6, 0.9]), 0.6)["contamination"]
    0.5
    """
    if len(scores) == 0:
        return {"rows": 0}
    figures: dict[str, Any] = {
        "rows": len(scores),
        "mean": round(float(scores.mean()), 4),
        **quantiles(scores, QUANTILES, 4),
    }
    figures["max"] = round(float(scores.max()), 4)
    figures["threshold"] = threshold
    figures["contamination"] = round(float((scores >= threshold).mean()), 6)
    return figures


def _split(frame: pd.DataFrame, metrics: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    return frame[metrics], frame[[f"prev__{m}" for m in metrics]].set_axis(metrics, axis=1)


def train_fleet_models(spark: SparkSession, config: TrainConfig, registry: ModelRegistry) -> list[dict[str, Any]]:
    """Fit, evaluate and register (as candidates) one Isolation Forest per device type."""
    from pyspark.sql import functions as F

    readings = _readings(spark, config).cache()
    try:
        types = sorted(r[0] for r in readings.select("device_type").distinct().collect())
        if not types:
            raise IotwatchError(f"no in-range readings in {config.archive} for the chosen range and device types")
        results = []
        for device_type in types:
            long = readings.where(F.col("device_type") == device_type)
            metrics = sorted(r[0] for r in long.select("metric").distinct().collect())
            wide = _wide(long, metrics).cache()
            try:
                stats = wide.agg(
                    F.count(F.lit(1)).alias("rows"),
                    F.countDistinct("device_id").alias("devices"),
                    F.min("event_ms").alias("from_ms"),
                    F.max("event_ms").alias("to_ms"),
                    F.sum(F.col("_holdout").cast("int")).alias("holdout"),
                ).first()
                assert stats is not None  # an aggregate over a whole frame has one row
                train = _sample(wide, False, config.max_rows, config.seed)
                held = _sample(wide, True, max(config.max_rows // 4, 1), config.seed)
            finally:
                wide.unpersist()
            if len(train) < 2:
                log.warning("%s: only %d rows, not training", device_type, len(train))
                results.append({"device_type": device_type, "skipped": f"only {len(train)} training rows"})
                continue
            detector = IsolationForest(
                metrics=metrics,
                n_estimators=config.n_estimators,
                max_samples=config.max_samples,
                seed=config.seed,
                **config.params,
            )
            detector.fit(*_split(train, metrics))
            evaluation = {
                "train": evaluation_figures(detector.score_paired(*_split(train, metrics)), config.threshold),
                "holdout": evaluation_figures(detector.score_paired(*_split(held, metrics)), config.threshold),
                "metrics": metrics,
            }
            trained_on = TrainedOn(
                from_ms=stats["from_ms"],
                to_ms=stats["to_ms"],
                rows=len(train),
                devices=stats["devices"],
                eligible_rows=stats["rows"],
                holdout_rows=len(held),
                since_ms=config.since_ms,
                until_ms=config.until_ms,
            )
            version = registry.register(detector, device_type, trained_on=trained_on, evaluation=evaluation)
            log.info(
                "%s: registered %s version %d (%d rows from %d devices)",
                device_type,
                version.detector,
                version.version,
                len(train),
                stats["devices"],
            )
            results.append(_summary(version))
        return results
    finally:
        readings.unpersist()


def _summary(version: ModelVersion) -> dict[str, Any]:
    summary = version.model_dump(include={"device_type", "detector", "version", "status", "trained_on", "evaluation"})
    return {**summary, "path": str(version.path)}
