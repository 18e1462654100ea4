"""Fleet overview: is data flowing through every stage, how fast, and what is rejected."""

from __future__ import annotations

from iotwatch.dashboards.builder import (
    BLUE,
    GREEN,
    ORANGE,
    PURPLE,
    RED,
    YELLOW,
    Dashboard,
    Row,
    Stat,
    Target,
    TimeSeries,
    colour,
    colours,
    thresholds,
)
from iotwatch.dashboards.common import MSG_PER_S, PER_SECOND, gateway_rate, per_interval, up_down

PROGRESS = "\"stage\" = 'stream_progress'"
BATCH = "\"stage\" = 'stream'"
LAG = thresholds(GREEN, (10_000, ORANGE), (100_000, RED))
# The default trigger is 2 s: a batch slower than its trigger means the job falls behind.
BATCH_MS = thresholds(GREEN, (2_000, ORANGE), (10_000, RED))
# Heartbeats come every second: a few seconds is a slow link, a minute is a cut one.
REPLICATION_LAG_MS = thresholds(GREEN, (5_000, ORANGE), (60_000, RED))


def dashboard() -> Dashboard:
    now = Row(
        "Now",
        [
            Stat(
                title="Gateway forwarded",
                width=4,
                unit=MSG_PER_S,
                decimals=1,
                thresholds=thresholds(BLUE),
                description="Messages per second confirmed by Kafka, all gateway instances.",
                targets=[gateway_rate("forwarded", "forwarded")],
            ),
            Stat(
                title="Stream processed",
                width=4,
                unit=MSG_PER_S,
                decimals=1,
                thresholds=thresholds(BLUE),
                description="Rows per second the streaming job processed in its last micro-batch.",
                targets=[per_interval('mean("processed_rows_per_s")', "pipeline", PROGRESS)],
            ),
            Stat(
                title="Kafka lag",
                width=4,
                unit="short",
                thresholds=LAG,
                description="Records between what the job has read and the end of the raw topic. "
                "Growing = falling behind.",
                targets=[per_interval('last("lag_records")', "pipeline", PROGRESS)],
            ),
            Stat(
                title="Batch duration",
                width=4,
                unit="ms",
                thresholds=BATCH_MS,
                description="Wall time of the last micro-batch (all sinks). "
                "Above the trigger interval = falling behind.",
                targets=[per_interval('max("batch_duration_ms")', "pipeline", BATCH)],
            ),
            Stat(
                title="Alerts raised",
                width=4,
                unit="short",
                reduce="sum",
                thresholds=thresholds(GREEN, (1, ORANGE), (20, RED)),
                description="Alerts raised by the streaming job in the time range.",
                targets=[per_interval('sum("alerts_raised")', "pipeline", BATCH)],
            ),
            up_down(
                "Kafka reachable",
                "Worst gateway instance: DOWN if any gateway lost Kafka in its last report.",
                Target(
                    'SELECT min("up") FROM (SELECT last("kafka_up") AS "up" FROM "gateway" WHERE $timeFilter '
                    'GROUP BY "instance") WHERE $timeFilter'
                ),
                reduce="min",
            ),
        ],
    )
    ingest = Row(
        "Ingest rate per stage",
        [
            TimeSeries(
                title="Messages per second by stage",
                unit=MSG_PER_S,
                width=16,
                height=9,
                description="Gateway received and forwarded (rate of its cumulative counters, all instances) "
                "and the streaming job's input and processed rows per second. The lines should "
                "track each other; received is forwarded plus dead-lettered, so a gap between received and "
                "forwarded is dead letters or data waiting in the gateway.",
                targets=[
                    gateway_rate("received", "gateway received"),
                    gateway_rate("forwarded", "gateway forwarded"),
                    per_interval(
                        'mean("input_rows_per_s") AS "stream input", '
                        'mean("processed_rows_per_s") AS "stream processed"',
                        "pipeline",
                        PROGRESS,
                    ),
                ],
                overrides=colours(
                    {
                        "gateway received": BLUE,
                        "gateway forwarded": GREEN,
                        "stream input": PURPLE,
                        "stream processed": YELLOW,
                    }
                ),
            ),
            TimeSeries(
                title="Kafka lag over time",
                width=8,
                height=9,
                thresholds=LAG,
                threshold_style="dashed",
                color_mode="fixed",
                fixed_color=ORANGE,
                legend_calcs=("max", "lastNotNull"),
                description="Records not yet read by the streaming job, over all raw-topic partitions.",
                targets=[per_interval('max("lag_records") AS "lag"', "pipeline", PROGRESS)],
            ),
        ],
    )
    batches = Row(
        "Streaming job",
        [
            TimeSeries(
                title="Micro-batch duration",
                unit="ms",
                thresholds=BATCH_MS,
                threshold_style="dashed",
                description="Batch wall time (reading, scoring and every sink) and Spark's trigger execution time.",
                targets=[
                    per_interval(
                        'mean("batch_duration_ms") AS "batch mean", max("batch_duration_ms") AS "batch max"',
                        "pipeline",
                        BATCH,
                    ),
                    per_interval('mean("trigger_ms") AS "trigger"', "pipeline", PROGRESS),
                ],
                overrides=colours({"batch max": RED, "batch mean": BLUE, "trigger": PURPLE}),
            ),
            TimeSeries(
                title="Streaming state",
                description="Rows held in per-device state and the memory the state store uses.",
                targets=[
                    per_interval(
                        'last("state_rows") AS "state rows", last("state_memory_bytes") AS "state memory"',
                        "pipeline",
                        PROGRESS,
                    )
                ],
                overrides=[colour("state memory", PURPLE, unit="bytes", custom__axisPlacement="right")],
            ),
        ],
    )
    rejected = Row(
        "Rejected and repeated data",
        [
            TimeSeries(
                title="Dead-letter, late and duplicate rate",
                unit=MSG_PER_S,
                draw_style="bars",
                stacking="normal",
                legend_calcs=("sum", "max"),
                width=24,
                description="Records per second the stream dead-lettered (malformed), dropped as late (behind the "
                "watermark) or removed as duplicates, and what the gateway dead-lettered or saw "
                "repeated. Any dead letter needs a look at the DLQ topic.",
                targets=[
                    per_interval(
                        f'sum("dlq") {PER_SECOND} AS "stream dead-lettered", '
                        f'sum("late") {PER_SECOND} AS "stream late", '
                        f'sum("duplicate") {PER_SECOND} AS "stream duplicates"',
                        "pipeline",
                        BATCH,
                    ),
                    gateway_rate("dead_lettered", "gateway dead-lettered"),
                    gateway_rate("duplicates", "gateway duplicates"),
                ],
                overrides=[
                    colour("stream dead-lettered", RED),
                    colour("gateway dead-lettered", "dark-red"),
                    colour("stream late", ORANGE),
                    colour("stream duplicates", YELLOW),
                    colour("gateway duplicates", "light-yellow"),
                ],
            ),
        ],
    )
    devices = Row(
        "Devices offline and silences held",
        [
            TimeSeries(
                title="Goodbyes and held silences",
                draw_style="bars",
                legend_calcs=("sum", "max"),
                width=24,
                description="Devices that said goodbye (their last reading carried the offline event: marked "
                "offline, no device_silent) and devices past the silence timeout whose partition's input "
                "stopped too (an ingestion gap holds their silence; see the ingestion_gap runbook).",
                targets=[
                    per_interval(
                        'sum("goodbyes") AS "said goodbye", max("silence_held") AS "silences held"', "pipeline", BATCH
                    )
                ],
                overrides=colours({"said goodbye": BLUE, "silences held": ORANGE}),
            ),
        ],
    )
    sites = Row(
        "Sites",
        [
            TimeSeries(
                title="Replication lag by site",
                unit="ms",
                width=24,
                thresholds=REPLICATION_LAG_MS,
                threshold_style="dashed",
                description="How far the central Kafka cluster is behind each site: the age of the site's newest "
                "MirrorMaker 2 heartbeat at the centre (about a second while the link keeps up; it grows a "
                "second a second while the link is down). Empty with a single cluster.",
                targets=[per_interval('max("lag_ms")', "replication", by='"source"', alias="$tag_source")],
            ),
        ],
    )
    return Dashboard(
        uid="iotwatch-fleet-overview",
        title="iotwatch / Fleet overview",
        description="Ingest rate per stage, Kafka lag, micro-batch duration, rejected data and the sites' "
        "replication lag.",
        tags=("iotwatch", "pipeline"),
        rows=[now, ingest, batches, rejected, devices, sites],
    )
