"""Safe msgpack codec shared by the wire format and the view log.

Only plain msgpack types plus numpy arrays are representable. Arrays travel as a msgpack
extension (code 1) whose body is a tiny msgpack header ``[dtype, shape]`` followed by the raw
C-order bytes. Decoding never executes code (no pickle, no object dtypes): only the numeric
dtypes in ``ALLOWED_DTYPES`` are accepted, and the byte count must match dtype x shape exactly.
"""

from __future__ import annotations

import math
import threading

import msgpack
import numpy as np

ARRAY_EXT = 1
ALLOWED_DTYPES = frozenset(
    ["<f8", "<f4", "<i8", "<i4", "<i2", "|i1", "<u8", "<u4", "<u2", "|u1", "|b1"]
)
_DTYPES = {name: np.dtype(name) for name in ALLOWED_DTYPES}
#: The dtype of every protocol value (compared by identity on the hot paths).
FLOAT64 = _DTYPES["<f8"]
MAX_ARRAY_DIMS = 8
# Largest encoded header: fixarray + dtype string + array of MAX_ARRAY_DIMS uint64 values.
_HEADER_MAX = 1 + 6 + 1 + 9 * MAX_ARRAY_DIMS


class CodecError(ValueError):
    """Raised for bytes that are not a valid encoding."""


def raw_bytes(arr: np.ndarray):
    """The bytes of a C-contiguous array without copying them (a flat byte view)."""
    return memoryview(arr.reshape(-1)).cast("B") if arr.size else b""


#: The ``[dtype, shape]`` headers of the arrays encoded so far (a run has a few shapes).
_HEADERS: dict[tuple, bytes] = {}


def _default(obj):
    if isinstance(obj, np.ndarray):
        # np.require keeps 0-d arrays 0-d (ascontiguousarray would make them 1-d).
        arr = np.require(obj, requirements="C")
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        dtype = arr.dtype.str
        header = _HEADERS.get((dtype, arr.shape))
        if header is None:
            if dtype not in ALLOWED_DTYPES:
                raise TypeError(f"array dtype {dtype} cannot be encoded")
            header = msgpack.packb([dtype, list(arr.shape)])
            if len(_HEADERS) >= 256:
                _HEADERS.clear()
            _HEADERS[(dtype, arr.shape)] = header
        # ExtType needs bytes, so the array data is copied once here (straight from the array).
        return msgpack.ExtType(ARRAY_EXT, header + raw_bytes(arr))
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode object of type {type(obj).__name__}")


#: The bytes that follow each msgpack unsigned integer marker (uint 8, 16, 32, 64).
UINT_LENGTHS = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
#: msgpack's unsigned integer encodings by size in bytes, marker included: positive fixint,
#: uint 8, 16, 32, 64; and the marker byte of each (a fixint has none).
UINT_SIZES = (1, 2, 3, 5, 9)
UINT_MARKERS = {1: b"", 2: b"\xcc", 3: b"\xcd", 5: b"\xce", 9: b"\xcf"}


def uint_size(value: int) -> int:
    """The size of the shortest msgpack encoding of the unsigned ``value`` (of at most 64
    bits: the caller checks)."""
    if value < 0x80:
        return 1
    if value < 0x100:
        return 2
    if value < 0x10000:
        return 3
    return 5 if value < 0x100000000 else 9


def pack_uint(value: int, size: int) -> bytes:
    """``value`` as a msgpack unsigned integer of ``size`` bytes (any size its value fits:
    msgpack readers accept every one)."""
    if size == 1:
        return bytes((value,))
    return UINT_MARKERS[size] + value.to_bytes(size - 1, "big")


def _canonical_header(b: bytes) -> tuple[list, int] | None:
    """``([dtype, shape], offset)`` of a header as :func:`pack` writes it (a fixarray of a
    fixstr and a fixarray of unsigned ints) at the start of ``b``, read in place without
    building an unpacker; None for any other layout, which the general msgpack path then
    parses (and judges)."""
    try:
        if b[0] != 0x92 or not 0xA0 <= b[1] <= 0xBF:
            return None
        end = 2 + b[1] - 0xA0
        dtype = b[2:end].decode("ascii")
        count = b[end] - 0x90
        if not 0 <= count <= 0x0F or len(dtype) != end - 2:
            return None
        pos = end + 1
        shape = []
        for _ in range(count):
            c = b[pos]
            if c < 0x80:
                shape.append(c)
                pos += 1
                continue
            size = UINT_LENGTHS.get(c)
            if size is None or pos + 1 + size > len(b):
                return None
            shape.append(int.from_bytes(b[pos + 1 : pos + 1 + size], "big"))
            pos += 1 + size
        return [dtype, shape], pos
    except (IndexError, UnicodeDecodeError):
        return None


def _ext_hook(code: int, data: bytes):
    if code != ARRAY_EXT:
        raise CodecError(f"unknown extension type {code}")
    # The [dtype, shape] header is a few dozen bytes: read it where it is (the canonical
    # layout), or parse only a bounded prefix instead of feeding the whole body to an unpacker.
    fast = _canonical_header(data)
    if fast is not None:
        (dtype, shape), offset = fast
    else:
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=_HEADER_MAX + 1)
        unpacker.feed(bytes(memoryview(data)[:_HEADER_MAX]))
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
    dt = _DTYPES.get(dtype) if isinstance(dtype, str) else None
    if dt is None:
        raise CodecError(f"array dtype {dtype!r} is not allowed")
    if len(shape) > MAX_ARRAY_DIMS or not all(type(s) is int and s >= 0 for s in shape):
        raise CodecError(f"bad array shape {shape!r}")
    count = math.prod(shape)
    size = len(data) - offset
    if size != count * dt.itemsize:
        raise CodecError(
            f"array body has {size} bytes, dtype {dtype} shape {tuple(shape)} needs "
            f"{count * dt.itemsize}"
        )
    arr = np.frombuffer(data, dtype=dt, offset=offset) if size else np.empty(0, dtype=dt)
    return arr if len(shape) == 1 else arr.reshape(shape)


_local = threading.local()


def pack(obj) -> bytes:
    """Encode ``obj`` (dicts, lists, str, bytes, numbers, bool, None, numpy arrays)."""
    # One packer per thread, reused: msgpack.packb builds a packer per call, which costs 20 us
    # once an array goes through ``default`` (a view-log record of a value).
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(default=_default, use_bin_type=True)
    return packer.pack(obj)


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
