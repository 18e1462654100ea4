from iotwatch.streaming.operator_key import source_partition, stream_partition
from iotwatch.streaming.sinks.read_back import offset_runs


def test_offsets_close_together_are_read_in_one_run_and_far_apart_ones_in_their_own() -> None:
    assert offset_runs([7, 3, 3, 5, 5000, 5001, 20_000], gap=100) == [(3, 7), (5000, 5001), (20_000, 20_000)]
    assert offset_runs([]) == []


def test_the_source_partition_of_a_job_partition_is_the_kafka_partition_in_its_own_topic() -> None:
    assert source_partition(stream_partition("raw", 5, "raw")) == 5
    assert source_partition(stream_partition("site-b.raw", 5, "raw")) == 5
    assert stream_partition("site-b.raw", 5, "raw") != 5
