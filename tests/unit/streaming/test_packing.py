import numpy as np

from iotwatch.streaming.packing import dictionary_decode, dictionary_encode


def test_a_dictionary_encoded_column_decodes_to_the_same_values_none_included() -> None:
    values = np.array(["b", None, "a", "b", "b", None, "c"], dtype=object)
    codes, names = dictionary_encode(values)
    assert codes.dtype == np.int32 and len(names) == 3
    assert dictionary_decode(codes, names).tolist() == values.tolist()
    empty_codes, empty_names = dictionary_encode(np.array([], dtype=object))
    assert dictionary_decode(empty_codes, empty_names).tolist() == []
    assert dictionary_decode(*dictionary_encode(np.array([None, None], dtype=object))).tolist() == [None, None]
