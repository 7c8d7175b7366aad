"""Message envelope: exact round-trips, strict decoding, and fuzzing (only WireError escapes)."""

from __future__ import annotations

import random

import msgpack
import numpy as np
import pytest

from coordinator_free import codec
from coordinator_free.net import wire
from coordinator_free.net.wire import (
    MAX_MESSAGE_SIZE,
    Message,
    WireError,
    decode_message,
    encode_message,
    register_kind,
)


def _envelope(**over) -> dict:
    env = {"v": 1, "kind": "value", "round": 3, "step": 7, "payload": None, "meta": {}}
    env.update(over)
    return env


def _raw(env: dict) -> bytes:
    return codec.pack(env)


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", ["<f8", "<f4", "<i8", "<i4", "|i1", "<u2", "|b1"])
@pytest.mark.parametrize("shape", [(0,), (1,), (5,), (3, 4), (3, 0), (2, 3, 4)])
def test_array_round_trip(dtype, shape):
    rng = np.random.default_rng(0)
    arr = np.asarray(rng.standard_normal(shape) * 100).astype(dtype)
    msg = Message(kind="value", round=2, step=9, payload=arr, meta={"sigma": 0.5})
    out = decode_message(encode_message(msg))
    assert out == msg
    assert out.payload.dtype == np.dtype(dtype)
    assert out.payload.shape == shape
    assert np.array_equal(out.payload, arr)


@pytest.mark.parametrize(
    "payload",
    [None, np.arange(5.0), np.arange(12, dtype="<i2").reshape(3, 4)[:, 1:], np.zeros(0)],
)
def test_encoding_is_plain_codec_msgpack(payload):
    """The hand-written array extension decodes with the codec exactly like codec.pack's."""
    msg = Message("token", 5, 6, payload=payload, meta={"k": [1, 2]})
    ours = codec.unpack(encode_message(msg))
    ref = codec.unpack(
        codec.pack(_envelope(kind="token", round=5, step=6, payload=payload, meta={"k": [1, 2]}))
    )
    assert set(ours) == set(ref)
    for key in ref:
        if key == "payload" and payload is not None:
            assert ours[key].dtype == ref[key].dtype and ours[key].shape == ref[key].shape
            assert np.array_equal(ours[key], ref[key])
        else:
            assert ours[key] == ref[key]
    assert decode_message(codec.pack(ref)) == msg  # and the codec's own encoding decodes too


def test_none_payload_and_meta_round_trip():
    meta = {
        "a": 1,
        "neg": -(2**63),
        "big": 2**64 - 1,
        "f": 1.5,
        "s": "x",
        "b": b"\x00\xff",
        "n": None,
        "t": True,
        "path": [1, 2, [3, "four"]],
        "nested": {"k": {"j": [0.25]}},
    }
    msg = Message(kind="done", round=0, step=0, meta=meta)
    out = decode_message(encode_message(msg))
    assert out == msg
    assert out.payload is None
    assert out.meta == meta
    assert type(out.meta["t"]) is bool and type(out.meta["a"]) is int


def test_nan_and_big_endian_payloads_compare_bitwise():
    arr = np.array([np.nan, -0.0, np.inf])
    msg = Message(kind="value", round=0, step=0, payload=arr)
    assert decode_message(encode_message(msg)) == msg
    be = np.arange(6, dtype=">i4").reshape(2, 3)
    out = decode_message(encode_message(Message(kind="value", round=0, step=0, payload=be)))
    assert out.payload.dtype == np.dtype("<i4")
    assert np.array_equal(out.payload, be)


def test_non_contiguous_payload_and_numpy_scalars():
    arr = np.arange(24.0).reshape(4, 6)[:, ::2]
    msg = Message(
        kind="value",
        round=np.int64(4),
        step=np.uint8(2),
        payload=arr,
        meta={"x": np.float32(0.5), "i": np.int16(-3), "ok": np.bool_(True), "tup": (1, 2)},
    )
    assert type(msg.round) is int and msg.round == 4
    assert msg.meta == {"x": 0.5, "i": -3, "ok": True, "tup": [1, 2]}
    out = decode_message(encode_message(msg))
    assert out == msg
    assert np.array_equal(out.payload, arr)


def test_decoded_payload_is_read_only_view():
    out = decode_message(encode_message(Message("value", 0, 0, payload=np.ones(3))))
    assert not out.payload.flags.writeable


def test_meta_is_copied():
    meta = {"a": [1]}
    msg = Message("value", 0, 0, meta=meta)
    meta["a"].append(2)
    meta["b"] = 1
    assert msg.meta == {"a": [1]}


def test_equality():
    a = Message("value", 1, 2, payload=np.arange(3.0))
    assert a == Message("value", 1, 2, payload=np.arange(3.0))
    assert a != Message("value", 1, 2, payload=np.arange(3.0).astype("<f4"))
    assert a != Message("value", 1, 2, payload=np.arange(3.0).reshape(3, 1))
    assert a != Message("value", 1, 2)
    assert a != Message("value", 1, 3, payload=np.arange(3.0))
    with pytest.raises(TypeError):
        hash(a)


# --------------------------------------------------------------------------- kinds


def test_register_kind_extends_allowed_set():
    assert {"value", "done", "abort"} <= wire.ALLOWED_KINDS
    with pytest.raises(WireError, match="not a registered message kind"):
        Message("test_extra_kind", 0, 0)
    data = _raw(_envelope(kind="test_extra_kind"))
    with pytest.raises(WireError, match="kind"):
        decode_message(data)
    register_kind("test_extra_kind")
    register_kind("test_extra_kind")  # idempotent
    assert "test_extra_kind" in wire.ALLOWED_KINDS
    assert decode_message(data).kind == "test_extra_kind"


@pytest.mark.parametrize("bad", ["", "Value", "1abc", "a-b", "a" * 33, "ka ind", 5, None])
def test_register_kind_rejects_non_identifiers(bad):
    with pytest.raises(WireError, match="identifier"):
        register_kind(bad)


# --------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kind": 1}, "kind"),
        ({"kind": "nope"}, "kind"),
        ({"kind": "BAD KIND"}, "kind"),
        ({"round": True}, "round"),
        ({"round": -1}, "round"),
        ({"round": 2**63}, "round"),
        ({"round": 1.0}, "round"),
        ({"step": "3"}, "step"),
        ({"step": False}, "step"),
        ({"payload": [1.0, 2.0]}, "payload"),
        ({"payload": np.array(["a"])}, "payload"),
        ({"payload": np.array([1 + 2j])}, "payload"),
        ({"payload": np.zeros((1,) * 9)}, "payload"),
        ({"payload": np.array(1.0)}, "payload.*0-d"),
        ({"meta": [1]}, "meta"),
        ({"meta": {1: 2}}, "meta"),
        ({"meta": {"a": np.zeros(2)}}, "meta"),
        ({"meta": {"a": object()}}, "meta"),
        ({"meta": {"a": 2**64}}, "meta"),
        ({"meta": {"a": [[[[[1]]]]]}}, "meta"),
    ],
)
def test_constructor_rejects_bad_fields(kwargs, field):
    args = {"kind": "value", "round": 0, "step": 0} | kwargs
    with pytest.raises(WireError, match=field):
        Message(**args)


def test_encode_size_limit():
    msg = Message("value", 0, 0, payload=np.zeros(1000))
    assert len(encode_message(msg, max_size=9000)) <= 9000
    with pytest.raises(WireError, match="payload.*8000 bytes"):
        encode_message(msg, max_size=7999)
    with pytest.raises(WireError, match="over the limit"):
        encode_message(msg, max_size=8001)
    with pytest.raises(TypeError):
        encode_message({"kind": "value"})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- strict decoding


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "not a valid envelope"),
        (b"\xc1", "not a valid envelope"),
        (msgpack.packb([1, 2, 3]), "must be a map"),
        (msgpack.packb("value"), "must be a map"),
        (_raw({k: v for k, v in _envelope().items() if k != "v"}), "version"),
        (_raw(_envelope(v=2)), "'v' is 2"),
        (_raw(_envelope(v=True)), "'v' is True"),
        (_raw(_envelope(v="1")), "'v'"),
        (_raw({k: v for k, v in _envelope().items() if k != "meta"}), "lacks field.*'meta'"),
        (_raw({k: v for k, v in _envelope().items() if k != "step"}), "lacks field.*'step'"),
        (_raw(_envelope(extra=1)), "unknown field.*'extra'"),
        (_raw(_envelope(kind=7)), "'kind' must be a string"),
        (_raw(_envelope(kind="nope")), "'kind' 'nope' is not a registered"),
        (_raw(_envelope(kind="Bad Kind!")), "not a short identifier"),
        (_raw(_envelope(round=True)), "'round' must be an integer, got bool"),
        (_raw(_envelope(round=-1)), "'round' must be in"),
        (_raw(_envelope(round=2**64 - 1)), "'round' must be in"),
        (_raw(_envelope(step=1.0)), "'step' must be an integer, got float"),
        (_raw(_envelope(step=None)), "'step' must be an integer"),
        (_raw(_envelope(payload=b"\x00" * 8)), "'payload' must be an array or nil, got bytes"),
        (_raw(_envelope(payload=[1.0])), "'payload' must be an array or nil, got list"),
        (_raw(_envelope(meta=[])), "'meta' must be a map"),
        (_raw(_envelope(meta={"a": np.zeros(2)})), "meta.*'a'.*ndarray"),
        (msgpack.packb(_envelope(meta={b"k": 1}), use_bin_type=True), "key of type bytes"),
        (msgpack.packb({**_envelope(), b"v2": 1}, use_bin_type=True), "unknown field"),
        (_raw(_envelope(meta={"a": [[[[[1]]]]]})), "nests deeper"),
        (_raw(_envelope()) + b"\x00", "not a valid envelope"),
        (msgpack.packb(msgpack.ExtType(5, b"")), "not a valid envelope"),
    ],
)
def test_decode_rejects(data, match):
    with pytest.raises(WireError, match=match):
        decode_message(data)


def test_decode_rejects_bad_array_ext():
    header = msgpack.packb(["<f8", [3]])
    bad = msgpack.packb(
        {**_envelope(), "payload": msgpack.ExtType(codec.ARRAY_EXT, header + b"\x00" * 23)},
        use_bin_type=True,
    )
    with pytest.raises(WireError, match="array body"):
        decode_message(bad)
    header = msgpack.packb(["|O", [1]])
    bad = msgpack.packb(
        {**_envelope(), "payload": msgpack.ExtType(codec.ARRAY_EXT, header + b"\x00" * 8)},
        use_bin_type=True,
    )
    with pytest.raises(WireError, match="not allowed"):
        decode_message(bad)


def test_decode_size_limit():
    data = encode_message(Message("value", 0, 0, payload=np.zeros(100)))
    assert decode_message(data, max_size=len(data)).payload.shape == (100,)
    with pytest.raises(WireError, match="exceeds the limit"):
        decode_message(data, max_size=len(data) - 1)
    assert MAX_MESSAGE_SIZE == 64 << 20


def test_decode_accepts_bytearray_and_memoryview():
    data = encode_message(Message("abort", 1, 1, meta={"why": "x"}))
    assert decode_message(bytearray(data)) == decode_message(memoryview(data))


# --------------------------------------------------------------------------- fuzzing


def _valid_samples() -> list[bytes]:
    rng = np.random.default_rng(1)
    return [
        encode_message(Message("value", 1, 2, payload=rng.standard_normal(5))),
        encode_message(Message("done", 0, 0, meta={"a": [1, "b", {"c": None}]})),
        encode_message(Message("token", 9, 3, payload=np.arange(6, dtype="<i4").reshape(2, 3))),
    ]


def _check_only_wire_error(data: bytes) -> None:
    try:
        msg = decode_message(data)
    except WireError:
        return
    # Anything that decodes must be a well-formed message that re-encodes to the same meaning.
    assert isinstance(msg, Message)
    assert decode_message(encode_message(msg)) == msg


def test_fuzz_random_bytes():
    rnd = random.Random(1234)
    for _ in range(3000):
        _check_only_wire_error(rnd.randbytes(rnd.randrange(0, 64)))


def test_fuzz_mutations_of_valid_encodings():
    rnd = random.Random(99)
    samples = _valid_samples()
    for _ in range(4000):
        data = bytearray(rnd.choice(samples))
        op = rnd.randrange(4)
        if op == 0:  # flip bytes
            for _ in range(rnd.randrange(1, 4)):
                data[rnd.randrange(len(data))] = rnd.randrange(256)
        elif op == 1:  # truncate
            del data[rnd.randrange(len(data)) :]
        elif op == 2:  # insert random bytes
            pos = rnd.randrange(len(data) + 1)
            data[pos:pos] = rnd.randbytes(rnd.randrange(1, 5))
        else:  # delete a slice
            start = rnd.randrange(len(data))
            del data[start : start + rnd.randrange(1, 6)]
        _check_only_wire_error(bytes(data))


def _general(data: bytes):
    """What the general decoder makes of ``data`` (a bytearray never takes the in-place path):
    the message, or the WireError's text."""
    try:
        return decode_message(bytearray(data))
    except WireError as exc:
        return str(exc)


def _decoded(data: bytes):
    """What decode_message makes of ``data`` (bytes: the in-place and templated readers first):
    the message, or the WireError's text."""
    try:
        return decode_message(data)
    except WireError as exc:
        return str(exc)


def test_in_place_reader_agrees_with_the_general_decoder():
    """Envelopes as encode_message writes them (no meta) are read in place; on every mutation
    the result is the general decoder's, message or error."""
    rnd = random.Random(7)
    rng = np.random.default_rng(7)
    samples = [
        encode_message(Message("value", 0, 3, payload=rng.standard_normal(8))),
        encode_message(Message("value", 70000, 2**40, payload=rng.standard_normal(300))),
        encode_message(Message("done", 0, 12)),
        encode_message(Message("token", 1, 1, payload=np.arange(6, dtype="<i2").reshape(3, 2))),
        encode_message(Message("value", 0, 0, payload=np.zeros(0))),
        encode_message(Message("value", 0, 0, payload=np.zeros((2, 0, 3), dtype="|u1"))),
    ]
    for data in samples:
        fast = wire._decode_canonical(data)
        assert fast is not None and fast == decode_message(bytearray(data))
        assert fast.payload is None or not fast.payload.size or not fast.payload.flags.writeable
    # The payload is a view on the envelope's bytes, not a copy.
    big = encode_message(Message("value", 0, 1, payload=np.arange(1000.0)))
    assert np.shares_memory(decode_message(big).payload, np.frombuffer(big, dtype="u1"))
    for _ in range(6000):
        data = bytearray(rnd.choice(samples))
        op = rnd.randrange(4)
        if op == 0:
            for _ in range(rnd.randrange(1, 3)):
                data[rnd.randrange(len(data))] = rnd.randrange(256)
        elif op == 1:
            del data[rnd.randrange(len(data)) :]
        elif op == 2:
            pos = rnd.randrange(len(data) + 1)
            data[pos:pos] = rnd.randbytes(rnd.randrange(1, 5))
        else:
            start = rnd.randrange(len(data))
            del data[start : start + rnd.randrange(1, 6)]
        data = bytes(data)
        assert _decoded(data) == _general(data), data


def test_templated_reader_agrees_with_the_general_decoder():
    """Once an array message has been read in place, its envelope's constant parts are kept
    as a template: messages of that kind, round and shape are then read by matching the
    template around their step. Every step width, other shapes and kinds, and every mutation
    give the general decoder's result, message or error."""
    rnd = random.Random(11)
    rng = np.random.default_rng(11)
    wire._TEMPLATES.clear()
    first = encode_message(Message("value", 0, 3, payload=rng.standard_normal(8)))
    assert wire._decode_canonical(first) is not None and len(wire._TEMPLATES) == 1
    samples = [
        encode_message(Message("value", 0, step, payload=rng.standard_normal(8)))
        for step in (0, 127, 128, 255, 65536, 2**33, 2**63 - 1)
    ]
    samples += [
        encode_message(Message("value", 1, 3, payload=rng.standard_normal(8))),
        encode_message(Message("value", 0, 3, payload=rng.standard_normal(9))),
        encode_message(Message("value", 0, 3, payload=np.arange(8, dtype="<i8"))),
        encode_message(Message("token", 0, 3, payload=rng.standard_normal(8))),
    ]
    for data in samples:
        assert wire._decode_templated(data) is None or data in samples[:7]
        got = decode_message(data)
        assert got == _general(data) and not got.payload.flags.writeable
        assert np.shares_memory(got.payload, np.frombuffer(data, dtype="u1"))
    assert all(wire._decode_templated(d) is not None for d in samples[:7])
    for _ in range(6000):
        data = bytearray(rnd.choice(samples))
        for _ in range(rnd.randrange(1, 3)):
            if rnd.randrange(2):
                data[rnd.randrange(len(data))] = rnd.randrange(256)
            else:
                pos = rnd.randrange(len(data) + 1)
                data[pos:pos] = rnd.randbytes(rnd.randrange(1, 5))
        data = bytes(data)
        assert _decoded(data) == _general(data), data


def test_encode_parts_join_to_the_codec_encoding():
    """Without meta the envelope's head comes from a cache: the same bytes the codec writes."""
    for msg in (Message("done", 3, 2**33), Message("walk_end", 0, 7)):
        head = codec.pack(
            {"v": 1, "kind": msg.kind, "round": msg.round, "step": msg.step, "meta": {}}
        )
        joined = b"".join(wire.encode_parts(msg))
        assert joined == encode_message(msg) == b"\x86" + head[1:] + wire._PAYLOAD_KEY + b"\xc0"
        assert decode_message(joined) == msg


@pytest.mark.parametrize("round_", [0, 1, 200, 70000, 2**40])
@pytest.mark.parametrize("step", [0, 5, 127, 128, 255, 256, 65535, 65536, 2**33])
@pytest.mark.parametrize(
    "payload",
    [np.arange(8.0), np.arange(131072.0), np.ones((3, 5), dtype="<i4"), np.zeros(0), np.ones(1)],
    ids=["f8x8", "f8x131072", "i4x3x5", "empty", "f8x1"],
)
def test_payload_data_lies_aligned_in_the_envelope(round_, step, payload):
    """The payload's data starts at a multiple of 8 bytes (longer integer encodings where that
    aligns it), so a receiver uses it where it lies; the envelope decodes alike either way."""
    msg = Message("value", round_, step, payload=payload)
    parts = wire.encode_parts(msg)
    data = b"".join(parts)
    assert data == encode_message(msg)
    if payload.nbytes:
        assert (len(data) - payload.nbytes) % 8 == 0
        got = decode_message(data)
        assert got.payload.flags.aligned and np.shares_memory(
            got.payload, np.frombuffer(data, dtype="u1")
        )
    assert decode_message(data) == msg == decode_message(bytearray(data))
    assert codec.unpack(data)["step"] == step and codec.unpack(data)["round"] == round_


def test_value_message_is_the_checked_message():
    """``value_message`` is ``Message(kind="value", round=0, ...)``: the same message (fields,
    types, encoding) for a step's float64 vector, and for anything else the constructor's own
    result or error."""
    x = np.arange(8.0)
    for step, payload in (
        (0, x),
        (wire.MAX_STEP, x[:1]),
        (np.int64(3), x),
        (3, x.astype(np.float32)),
        (3, x.reshape(2, 4)),
        (3, x[::2]),
    ):
        fast = wire.value_message(step, payload)
        ref = Message(kind="value", round=0, step=step, payload=payload)
        assert fast == ref and type(fast.step) is int and fast.meta == {}
        assert wire.encode_message(fast) == wire.encode_message(ref)
    for step, payload in ((-1, x), (wire.MAX_STEP + 1, x), (True, x), (1.0, x), (1, [1.0])):
        with pytest.raises(WireError):
            Message(kind="value", round=0, step=step, payload=payload)
        with pytest.raises(WireError):
            wire.value_message(step, payload)
