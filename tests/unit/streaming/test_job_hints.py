"""What the streaming job adds to Spark's error when the user can act on it (no Spark needed)."""

from __future__ import annotations


def test_a_checkpoint_of_another_state_layout_gets_a_hint_others_none() -> None:
    """Spark's words for a checkpoint another version of iotwatch wrote, plus what to do about it."""
    from iotwatch.streaming.job import _hint

    spark_error = (
        "[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] Provided key schema does not match existing state key schema."
    )
    assert "new --checkpoint directory" in _hint(spark_error)
    assert _hint("[STREAM_FAILED] something else") == ""


def test_offsets_kafka_no_longer_has_end_the_job_at_once_naming_the_way_out() -> None:
    """Retention deleted what the job had not read (or the topic was re-created) while it ran:
    starting again from the same checkpoint fails the same way, so the job ends and says what to do."""
    from iotwatch.streaming.checkpoint import WAY_OUT
    from iotwatch.streaming.job import _hint, _restartable

    spark_error = (
        "org.apache.spark.SparkException: Some data may have been lost because they are not available in "
        "Kafka any more; either the data was aged out by Kafka or the topic may have been deleted"
    )
    assert not _restartable(spark_error)
    assert WAY_OUT in _hint(spark_error) and "--reset-offsets earliest|latest" in _hint(spark_error)
    assert _restartable("Python worker exited unexpectedly (crashed)")
