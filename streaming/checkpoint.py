"""The job's checkpoint: which Kafka cluster it belongs to, and whether that cluster still has
its offsets (docs/operate/streaming.md, "Checkpoint").
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from confluent_kafka import Consumer, KafkaException, TopicPartition

from iotwatch.clients.kafka import client_config, end_offset
from iotwatch.errors import ServiceUnavailable, UserError
from iotwatch.settings import Settings

log = logging.getLogger(__name__)

#: Where default checkpoints live, one folder per Kafka cluster id.
CHECKPOINTS_ROOT = Path("~/.iotwatch/checkpoints")
#: The file in a checkpoint naming the Kafka cluster it was written for (Spark ignores it).
SOURCE_FILE = "iotwatch-kafka.json"
#: The way out, named by every refusal.
WAY_OUT = (
    "start with a new --checkpoint DIR, or pass --reset-offsets earliest|latest to set this one aside "
    "and read the topic from its start or its end"
)

ResetTo = Literal["earliest", "latest"]


def cluster_id(settings: Settings, timeout_s: float = 10.0) -> str:
    """The Kafka cluster's id, as its metadata reports it (KRaft and ZooKeeper clusters alike)."""
    consumer = Consumer({**client_config(settings.kafka), "group.id": "iotwatch-checkpoint", "log_level": 0})
    try:
        found = consumer.list_topics(timeout=timeout_s).cluster_id
    except KafkaException as exc:
        raise ServiceUnavailable(f"Kafka at {settings.kafka.bootstrap_servers} did not answer: {exc}") from exc
    finally:
        consumer.close()
    if not found:
        raise ServiceUnavailable(f"Kafka at {settings.kafka.bootstrap_servers} reports no cluster id")
    return str(found)


def default_checkpoint(cluster: str) -> Path:
    """The default checkpoint of the job reading Kafka cluster ``cluster``."""
    return (CHECKPOINTS_ROOT / cluster / "stream").expanduser().resolve()


def resolve_checkpoint(settings: Settings, checkpoint_dir: Path | None) -> Path:
    """``--checkpoint``, else ``IOTWATCH_STREAM_CHECKPOINT_DIR``, else the Kafka cluster's default."""
    chosen = checkpoint_dir or settings.stream.checkpoint_dir
    return Path(chosen).expanduser().resolve() if chosen else default_checkpoint(cluster_id(settings))


def prepare_checkpoint(settings: Settings, checkpoint: Path, cluster: str, reset: ResetTo | None) -> None:
    """Refuse a checkpoint of another cluster, or one whose offsets Kafka no longer has
    (:class:`UserError`, one line); with ``reset``, set such a checkpoint aside instead (any
    existing one, in fact: the user asked to start over). Then record ``cluster`` in it and
    drop an interrupted micro-batch's offsets (:func:`drop_interrupted_batch`)."""
    if reset and checkpoint.exists() and any(path.name != SOURCE_FILE for path in checkpoint.iterdir()):
        aside = checkpoint.with_name(f"{checkpoint.name}.set-aside-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
        checkpoint.rename(aside)
        log.warning("checkpoint %s set aside as %s; reading the topic from its %s", checkpoint, aside, reset)
    elif problem := checkpoint_problem(settings, checkpoint, cluster):
        raise UserError(f"checkpoint {checkpoint} {problem}: {WAY_OUT}")
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / SOURCE_FILE).write_text(
        json.dumps({"kafka_cluster_id": cluster, "bootstrap_servers": settings.kafka.bootstrap_servers}) + "\n"
    )
    if (interrupted := drop_interrupted_batch(checkpoint)) is not None:
        log.info("micro-batch %d was interrupted: planned again over all records waiting", interrupted)


def checkpoint_problem(settings: Settings, checkpoint: Path, cluster: str) -> str | None:
    """Why the job cannot resume from ``checkpoint`` on ``cluster``, or None (a new checkpoint,
    or one whose every offset is still in the log)."""
    try:
        committed = committed_offsets(checkpoint)
    except (OSError, ValueError, IndexError) as exc:  # IndexError: an offset log cut short
        raise UserError(f"checkpoint {checkpoint} cannot be read ({exc}): {WAY_OUT}") from exc
    if committed is None:
        return None
    source = checkpoint / SOURCE_FILE
    if source.exists():
        written_for = json.loads(source.read_text()).get("kafka_cluster_id")
        if written_for and written_for != cluster:
            return f"belongs to Kafka cluster {written_for}, not {cluster} at {settings.kafka.bootstrap_servers}"
    if settings.topics.raw_pattern:
        return None  # the topics are found as they appear: Spark checks them
    offsets = raw_offsets(settings)
    if offsets is None:
        return None  # Kafka did not answer: Spark's own retries and errors take over
    for partition, offset in sorted(committed.get(settings.topics.raw, {}).items(), key=lambda kv: int(kv[0])):
        span = offsets.get(int(partition))
        where = f"{settings.topics.raw} partition {partition}"
        if span is None:
            return f"reads {where}, which Kafka does not have"
        log_start, end = span
        if offset > end:
            return f"is at offset {offset:,} of {where}, past its end {end:,} (another or a re-created topic)"
        if offset < log_start:
            return f"is at offset {offset:,} of {where}, whose log now starts at {log_start:,} (records deleted)"
    return None


def batch_ids(checkpoint: Path, log: Literal["offsets", "commits"]) -> list[int]:
    """The micro-batches in one of Spark's logs of ``checkpoint``, in order (none for a new one)."""
    return sorted(int(f.name) for f in (checkpoint / log).glob("[0-9]*") if f.name.isdigit())


def committed_offsets(checkpoint: Path) -> dict[str, dict[str, int]] | None:
    """The Kafka offsets of the checkpoint's last committed micro-batch (Spark's offset log:
    a version line, the batch's metadata, then one line per source); None for a new one."""
    commits = batch_ids(checkpoint, "commits")
    if not commits:
        return None
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    offsets: dict[str, dict[str, int]] = json.loads(lines[2])
    return offsets


def drop_interrupted_batch(checkpoint: Path) -> int | None:
    """Forget the offsets of the micro-batch a crash interrupted (logged, never committed): the
    restarted query then plans that batch anew, over everything waiting, rather than running it
    again on its own first and the backlog after it (two cold micro-batches before the job has
    caught up, instead of one). Its outputs are written again either way: the operator's state
    goes back to the last commit, and what the interrupted run wrote is kept idempotent by
    reading (docs/streaming-internals.md, "Restarts"). The state-store files the interrupted
    batch's tasks committed go too: a snapshot of that version, once of other input than its
    re-planned batch's, would otherwise be what a later start loads. The batch's id, or None."""
    logged, committed = batch_ids(checkpoint, "offsets"), batch_ids(checkpoint, "commits")
    if not committed or logged[-1:] != [committed[-1] + 1]:
        return None
    interrupted = logged[-1]
    for name in (f".{interrupted}.crc", str(interrupted)):  # Spark reads the file, never its checksum alone
        (checkpoint / "offsets" / name).unlink(missing_ok=True)
    # a batch writes version id + 1 of each state partition: a changelog, perhaps a snapshot (and checksums)
    written = re.compile(rf"^\.?{interrupted + 1}(_[0-9a-f-]+)?\.(changelog|zip|delta|snapshot)(\.crc)?$")
    for path in (checkpoint / "state").rglob("*"):
        if written.match(path.name):
            path.unlink()
    return interrupted


def raw_offsets(settings: Settings, timeout_s: float = 5.0) -> dict[int, tuple[int, int]] | None:
    """Each partition of the raw topic with its log start and end offsets; None when Kafka
    does not answer or the topic is missing."""
    raw = settings.topics.raw
    try:
        consumer = Consumer({**client_config(settings.kafka), "group.id": "iotwatch-checkpoint", "log_level": 0})
    except KafkaException:
        return None
    try:
        metadata = consumer.list_topics(raw, timeout=timeout_s).topics.get(raw)
        if metadata is None or metadata.error is not None:
            return None
        offsets = {}
        for number in sorted(metadata.partitions):
            partition = TopicPartition(raw, number)
            end = end_offset(consumer, partition, timeout_s)
            offsets[number] = (int(consumer.get_watermark_offsets(partition, timeout=timeout_s)[0]), end)
        return offsets
    except KafkaException:
        return None
    finally:
        consumer.close()
