"""Safe msgpack codec shared by the wire format and the view log.

Only plain msgpack types plus numpy arrays are representable. Arrays travel as a msgpack
extension (code 1) whose body is a tiny msgpack header ``[dtype, shape]`` followed by the raw
C-order bytes. Decoding never executes code (no pickle, no object dtypes): only the numeric
dtypes in ``ALLOWED_DTYPES`` are accepted, and the byte count must match dtype x shape exactly.
"""

from __future__ import annotations

import math

import msgpack
import numpy as np

ARRAY_EXT = 1
ALLOWED_DTYPES = frozenset(
    ["<f8", "<f4", "<i8", "<i4", "<i2", "|i1", "<u8", "<u4", "<u2", "|u1", "|b1"]
)
MAX_ARRAY_DIMS = 8
# Largest encoded header: fixarray + dtype string + array of MAX_ARRAY_DIMS uint64 values.
_HEADER_MAX = 1 + 6 + 1 + 9 * MAX_ARRAY_DIMS


class CodecError(ValueError):
    """Raised for bytes that are not a valid encoding."""


def _default(obj):
    if isinstance(obj, np.ndarray):
        # np.require keeps 0-d arrays 0-d (ascontiguousarray would make them 1-d).
        arr = np.require(obj, requirements="C")
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        dtype = arr.dtype.str
        if dtype not in ALLOWED_DTYPES:
            raise TypeError(f"array dtype {dtype} cannot be encoded")
        header = msgpack.packb([dtype, list(arr.shape)])
        # ExtType needs bytes, so the array data is copied once here.
        return msgpack.ExtType(ARRAY_EXT, header + arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode object of type {type(obj).__name__}")


def _ext_hook(code: int, data: bytes):
    if code != ARRAY_EXT:
        raise CodecError(f"unknown extension type {code}")
    # The [dtype, shape] header is a few dozen bytes: parse only a bounded prefix instead of
    # copying the whole array body into the unpacker.
    prefix = bytes(memoryview(data)[:_HEADER_MAX])
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=_HEADER_MAX + 1)
    unpacker.feed(prefix)
    try:
        header = unpacker.unpack()
    except Exception as exc:  # msgpack raises several types here
        raise CodecError(f"bad array header: {exc}") from None
    offset = unpacker.tell()
    if (
        not isinstance(header, list)
        or len(header) != 2
        or not isinstance(header[0], str)
        or not isinstance(header[1], list)
    ):
        raise CodecError("bad array header: expected [dtype, shape]")
    dtype, shape = header
    if dtype not in ALLOWED_DTYPES:
        raise CodecError(f"array dtype {dtype!r} is not allowed")
    if len(shape) > MAX_ARRAY_DIMS or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise CodecError(f"bad array shape {shape!r}")
    dt = np.dtype(dtype)
    count = math.prod(shape)
    body = memoryview(data)[offset:]
    if len(body) != count * dt.itemsize:
        raise CodecError(
            f"array body has {len(body)} bytes, dtype {dtype} shape {tuple(shape)} needs "
            f"{count * dt.itemsize}"
        )
    return np.frombuffer(body, dtype=dt).reshape(shape)


def pack(obj) -> bytes:
    """Encode ``obj`` (dicts, lists, str, bytes, numbers, bool, None, numpy arrays)."""
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def unpack(data: bytes, *, max_size: int | None = None):
    """Decode bytes produced by :func:`pack`; raises :class:`CodecError` on anything else."""
    if max_size is not None and len(data) > max_size:
        raise CodecError(f"encoded object of {len(data)} bytes exceeds the limit {max_size}")
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            ext_hook=_ext_hook,
            strict_map_key=True,
            use_list=True,
        )
    except CodecError:
        raise
    except Exception as exc:  # ExtraData, FormatError, StackError, ValueError, TypeError...
        raise CodecError(f"malformed msgpack: {type(exc).__name__}: {exc}") from None
