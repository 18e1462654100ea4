import numpy as np
import pyarrow as pa

from iotwatch.contract.metric_catalog import KNOWN_METRICS
from iotwatch.contract.telemetry import decode_batch
from iotwatch.streaming.operator_rows import unpack
from iotwatch.streaming.packing import dictionary_decode, dictionary_encode, pack_chunk
from iotwatch.streaming.schemas import PACKED_BUFFERS
from tests.helpers import reading


def test_a_dictionary_encoded_column_decodes_to_the_same_values_none_included() -> None:
    values = np.array(["b", None, "a", "b", "b", None, "c"], dtype=object)
    codes, names = dictionary_encode(values)
    assert codes.dtype == np.int32 and len(names) == 3
    assert dictionary_decode(codes, names).tolist() == values.tolist()
    empty_codes, empty_names = dictionary_encode(np.array([], dtype=object))
    assert dictionary_decode(empty_codes, empty_names).tolist() == []
    assert dictionary_decode(*dictionary_encode(np.array([None, None], dtype=object))).tolist() == [None, None]


def test_chunks_unpack_to_what_the_decoder_gives_numeric_columns_as_buffers() -> None:
    """Two chunks of one partition, as the stateful operator receives them (Arrow to pandas,
    in any order), unpack to the decoder's columns: rejected records with their key, reason
    and bytes, every numeric column typed as the buffers declare it."""
    payloads = [reading(f"th-{i % 3}", i, ts=1_700_000_000_000 + i).to_json() for i in range(7)]
    payloads[2] = b"{not json"
    payloads[5] = b'{"v": 1}'
    keys = [f"th-{i % 3}".encode() for i in range(7)]
    offsets = np.arange(100, 107, dtype=np.int64)
    stamps = np.arange(7, dtype=np.int64) + 5
    chunks = [
        pack_chunk("raw", 3, 2, keys[at], payloads[at], offsets[at], stamps[at]) for at in (slice(4, 7), slice(0, 4))
    ]
    assert all(pa.types.is_binary(chunks[0].schema.field(name).type) for name in PACKED_BUFFERS)
    frames = [pa.Table.from_batches([chunk]).to_pandas() for chunk in chunks]
    records = unpack(iter(frames), 3)

    expected = decode_batch(payloads, keys, metrics_of=KNOWN_METRICS)
    assert records.offset.tolist() == offsets.tolist() and records.append_ms.tolist() == stamps.tolist()
    assert records.topic == "raw" and records.partition == 3
    for name in ("reason", "device_id", "device_type", "site", "event", "seq", "ts", "metric_row", "metric_name"):
        assert getattr(records.decoded, name).tolist() == getattr(expected, name).tolist(), name
    assert np.array_equal(records.decoded.metric_value, expected.metric_value)
    assert records.decoded.seq.dtype == np.int64 and records.decoded.metric_row.dtype == np.int64
    assert [i for i, key in enumerate(records.key) if key is not None] == [2, 5]
    assert records.raw[2] == b"{not json" and records.raw[5] == b'{"v": 1}' and records.raw[0] is None
