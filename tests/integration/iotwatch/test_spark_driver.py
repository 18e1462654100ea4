"""The local-mode driver JVM as :mod:`iotwatch.spark` starts it."""

from __future__ import annotations

from typing import Any

from iotwatch.spark import LOCAL_DRIVER_MEMORY


def test_the_driver_heap_is_committed_at_start(spark: Any) -> None:
    """The heap is committed at its maximum from the start (``-Xms`` = ``-Xmx``, pre-touched),
    so the driver's resident memory does not climb as the collector grows the heap."""
    runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
    assert LOCAL_DRIVER_MEMORY == "1g"
    assert runtime.maxMemory() >= 0.9 * 2**30
    assert runtime.totalMemory() >= 0.95 * runtime.maxMemory()
    management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    arguments = list(management.getRuntimeMXBean().getInputArguments())
    assert "-XX:+AlwaysPreTouch" in arguments
