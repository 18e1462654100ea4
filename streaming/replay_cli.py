"""``iotwatch replay``: reprocess the whole log with the current code (Kappa).

The raw topic is the immutable history. A replay runs the same job from the earliest
offsets with a fresh checkpoint into separate outputs -- alert and dead-letter topics
suffixed ``.<tag>``, its own archive directory and InfluxDB database -- so the new
version's results can be compared with the live ones before switching over.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import click

from iotwatch.cli import AppContext, emit, endpoint_options, json_option, pass_app
from iotwatch.clients.kafka import read_to_end
from iotwatch.contract.alerts import AlertRecord, BadAlert, decode_alert
from iotwatch.errors import IotwatchError
from iotwatch.settings import KafkaSettings, Settings
from iotwatch.streaming.checkpoint import resolve_checkpoint


def replay_settings(settings: Settings, tag: str) -> tuple[Settings, Path, Path]:
    """Settings whose outputs are all separate from the live job's, plus checkpoint and archive dirs."""
    topics = settings.topics.model_copy(
        update={"alerts": f"{settings.topics.alerts}.{tag}", "dlq": f"{settings.topics.dlq}.{tag}"}
    )
    influx = settings.influx.model_copy(update={"database": f"{settings.influx.database}_{tag}"})
    stream = settings.stream.model_copy(update={"starting_offsets": "earliest"})
    root = resolve_checkpoint(settings, None).parent
    return (
        settings.model_copy(update={"topics": topics, "influx": influx, "stream": stream}),
        root / f"replay-{tag}",
        Path(settings.stream.archive_dir).expanduser().resolve().parent / f"archive-{tag}",
    )


def alert_ids(kafka: KafkaSettings, topic: str) -> dict[str, AlertRecord]:
    """alert_id -> its raised record (the whole topic, read from the beginning; records that
    are not alerts are skipped)."""
    found: dict[str, AlertRecord] = {}
    for message in read_to_end(kafka, topic):
        try:
            alert = decode_alert(message.value())
        except BadAlert:
            continue
        if alert.raised:
            found.setdefault(alert.alert_id, alert)
    return found


#: Why a rule's alerts differ between the live job and a replay although the code is the same.
DIFFERENCE_REASONS: dict[str, str] = {
    "device_silent": "the live job's timer raises it when a device stops sending while the job waits; "
    "a replay runs through the log at once and sees only the gaps inside it",
    "ingestion_gap": "raised from the live input's arrival times, which a replay of the log does not wait through",
}
CHANGED = "scored differently: a change of code, settings or model since the live run"


def compare(live: dict[str, AlertRecord], replayed: dict[str, AlertRecord]) -> dict[str, Any]:
    """What the replay raised that the live job did not, and the reverse, by rule, each rule
    with why it may differ with the same code, or that it is a change of behaviour worth
    looking at."""

    def by_rule(ids: set[str], source: dict[str, AlertRecord]) -> dict[str, int]:
        return dict(sorted(Counter(source[alert_id].rule for alert_id in ids).items()))

    both = set(live) & set(replayed)
    return {
        "live_alerts": len(live),
        "replay_alerts": len(replayed),
        "same": len(both),
        "only_live": (only_live := by_rule(set(live) - both, live)),
        "only_replay": (only_replay := by_rule(set(replayed) - both, replayed)),
        "why": {rule: DIFFERENCE_REASONS.get(rule, CHANGED) for rule in {**only_live, **only_replay}},
    }


@click.command()
@endpoint_options(kafka=True, influx=True)
@click.option("--tag", required=True, help="Names the replay's outputs: topics <name>.<tag>, database <db>_<tag>.")
@click.option("--follow", is_flag=True, help="Keep running on new data after catching up (default: stop).")
@click.option("--keep-checkpoint", is_flag=True, help="Resume an earlier replay with this tag instead of restarting.")
@json_option
@pass_app
def replay(app: AppContext, tag: str, follow: bool, keep_checkpoint: bool, as_json: bool) -> None:
    """Reprocess the raw topic from its earliest offsets with the current code.

    Outputs go to separate topics, archive and InfluxDB database; at the end the replay's
    raised alerts are compared with the live alert topic's (alert ids are deterministic,
    so identical behaviour gives identical ids).
    """
    if not tag.replace("-", "").replace("_", "").isalnum():
        raise IotwatchError(f"--tag {tag!r}: use letters, digits, '-' and '_'")
    settings, checkpoint, archive = replay_settings(app.settings, tag)
    if checkpoint.exists() and not keep_checkpoint:
        shutil.rmtree(checkpoint)
    from iotwatch.streaming.job import run_job  # (pyspark loads only when the replay runs)

    job = run_job(settings, checkpoint, archive, available_now=not follow, duration=None, query_name=f"replay_{tag}")
    comparison = compare(
        alert_ids(settings.kafka, app.settings.topics.alerts), alert_ids(settings.kafka, settings.topics.alerts)
    )
    result = {
        "tag": tag,
        "checkpoint": str(checkpoint),
        "archive": str(archive),
        "alerts_topic": settings.topics.alerts,
        "dlq_topic": settings.topics.dlq,
        "influx_database": settings.influx.database,
        "totals": dict(job.totals),
        "comparison": comparison,
    }
    emit(result, as_json, render_replay)


def render_replay(result: dict[str, Any]) -> None:
    """The replay's line, then one line per rule whose alerts differ, saying why they may."""
    comparison = result["comparison"]
    click.echo(
        f"replay {result['tag']}: {result['totals'].get('reading_records', 0)} readings, "
        f"alerts live {comparison['live_alerts']} / replay {comparison['replay_alerts']} / same {comparison['same']}"
    )
    for side in ("only_live", "only_replay"):
        for rule, count in comparison[side].items():
            click.echo(f"  {side.replace('_', ' ')}: {count} {rule} -- {comparison['why'][rule]}")
