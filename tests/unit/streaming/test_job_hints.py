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
