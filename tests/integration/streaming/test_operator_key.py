"""The stateful operator's grouping key against Spark itself: our Murmur3 is Spark's
``hash()``, and the keys put Kafka partition ``p`` on the operator's task ``p mod n``, which
the bare partition numbers did not (4 partitions hashed 3 to 1 onto 2 tasks)."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import functions as F

from iotwatch.streaming.operator_key import operator_key, partition_of, spark_hash_long


def test_spark_hash_long_is_sparks_hash(spark) -> None:
    rng = random.Random(7)
    values = [0, 1, -1, 2**31 - 1, 2**31, 2**32, 2**32 + 5, -(2**40), 2**63 - 1, -(2**63)]
    values += [rng.randrange(-(2**63), 2**63) for _ in range(500)]
    frame = spark.createDataFrame([(v,) for v in values], "v long")
    sparks = {row.v: row.h for row in frame.select("v", F.hash("v").alias("h")).collect()}
    assert {v: spark_hash_long(v) for v in values} == sparks


@pytest.mark.parametrize("tasks", [1, 2, 3, 4, 200])
def test_keys_spread_partitions_over_tasks_and_name_their_partition(spark, tasks: int) -> None:
    keys = [operator_key(p, tasks) for p in range(64)]
    assert [partition_of(k) for k in keys] == list(range(64))
    assert [partition_of((k,)) for k in keys] == list(range(64))  # as transformWithState passes it
    frame = spark.createDataFrame([(k,) for k in keys], "k long")
    placed = [row.t for row in frame.select(F.expr(f"pmod(hash(k), {tasks})").alias("t")).collect()]
    assert placed == [p % tasks for p in range(64)]


def test_the_bare_partition_numbers_were_unbalanced(spark) -> None:
    """Why the salt exists: Spark's hash puts partitions 0, 1 and 3 on the same one of 2 tasks."""
    frame = spark.createDataFrame([(p,) for p in range(4)], "p int")
    placed = [row.t for row in frame.select(F.expr("pmod(hash(p), 2)").alias("t")).collect()]
    assert sorted(placed.count(t) for t in (0, 1)) == [1, 3]
