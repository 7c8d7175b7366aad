import numpy as np
import pytest

from coordinator_free import codec


@pytest.mark.parametrize(
    "arr",
    [
        np.array(3.5),
        np.zeros((3, 0)),
        np.arange(12, dtype=np.int32).reshape(3, 4),
        np.arange(10.0)[::2],  # non-contiguous
        np.array([1.0, 2.0], dtype=">f8"),  # big-endian input is stored little-endian
        np.array([True, False]),
    ],
)
def test_arrays_round_trip_with_shape_and_values(arr):
    out = codec.unpack(codec.pack({"a": arr}))["a"]
    assert out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)


def test_object_arrays_and_unknown_types_are_refused():
    with pytest.raises(TypeError):
        codec.pack(np.array([object()], dtype=object))
    with pytest.raises(TypeError):
        codec.pack({"x": {1, 2}})


@pytest.mark.parametrize(
    "data, fragment",
    [
        (b"\xc1", "malformed"),
        (b"\xd4\x07\x00", "unknown extension type 7"),
        # ext 1 whose header claims 2 float64 but carries 8 bytes
        (b"\xc7\x0d\x01" + b"\x92\xa3<f8\x91\x02" + b"\x00" * 8, "needs 16"),
        (b"\xc7\x0d\x01" + b"\x92\xa3|O8\x91\x01" + b"\x00" * 8, "not allowed"),
        (b"\x81\x01\x02", "malformed"),  # int map key refused (strict_map_key)
    ],
)
def test_malformed_inputs_raise_codec_error(data, fragment):
    with pytest.raises(codec.CodecError) as ei:
        codec.unpack(data)
    assert fragment in str(ei.value)


def test_size_limit():
    with pytest.raises(codec.CodecError, match="exceeds the limit"):
        codec.unpack(codec.pack(np.zeros(100)), max_size=100)


def test_a_failed_pack_leaves_the_reused_packer_clean():
    """pack() reuses one packer per thread: an object it refuses must not leave half a record
    in it for the next call."""
    with pytest.raises(TypeError, match="cannot encode"):
        codec.pack({"a": 1, "b": object()})
    x = np.arange(4.0)
    out = codec.unpack(codec.pack({"v": x, "n": 2}))
    assert out["n"] == 2 and np.array_equal(out["v"], x)
