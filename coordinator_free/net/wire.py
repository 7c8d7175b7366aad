"""The message envelope carried inside an encrypted channel frame.

A :class:`Message` is encoded as one msgpack map with exactly these fields::

    {"v": 1, "kind": str, "round": int, "step": int, "payload": ndarray | nil, "meta": map}

``payload`` travels as the codec's array extension (dtype, shape, raw C-order bytes), so a
float64 vector of ``d`` entries costs ``8 d`` bytes plus a header of a few dozen bytes. Encoding
copies the array data exactly once, into the output buffer (plus one conversion copy if the
array is not C-contiguous or is big-endian; :func:`encode_parts` gives the pieces without
joining them). Decoding returns a **read-only** array: an envelope laid out as
:func:`encode_message` writes it without meta (every ``value`` message) is read in place and
its payload is a view on the envelope's own bytes, never copied; any other layout goes through
msgpack, and the payload is a view on the bytes msgpack hands to the extension decoder. Copy it
(``np.array(msg.payload)``) before modifying it. 0-d arrays are refused (send shape ``(1,)``).

Decoding is strict: anything that is not exactly a version-1 envelope with well-typed fields
raises :class:`WireError` naming the offending field. The encoded size is bounded by
``max_size`` (default :data:`MAX_MESSAGE_SIZE`, 64 MiB) on both sides; the transport passes its
frame limit so that a message that fits the wire also fits a frame.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from coordinator_free import codec
from coordinator_free.codec import UINT_LENGTHS, UINT_SIZES, pack_uint, uint_size

__all__ = [
    "ALLOWED_KINDS",
    "MAX_MESSAGE_SIZE",
    "MAX_META_DEPTH",
    "MAX_STEP",
    "WIRE_VERSION",
    "Message",
    "WireError",
    "decode_message",
    "encode_message",
    "encode_parts",
    "register_kind",
]

WIRE_VERSION = 1
MAX_MESSAGE_SIZE = 64 << 20
#: Largest round or step number (they must fit a signed 64-bit integer in logs).
MAX_STEP = (1 << 63) - 1
#: Nesting limit for lists and maps inside ``meta``.
MAX_META_DEPTH = 4

_KIND_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_FIELDS = frozenset({"v", "kind", "round", "step", "payload", "meta"})
_PAYLOAD_KEY = msgpack.packb("payload")
_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 64) - 1  # the msgpack integer range

#: Message kinds accepted by :func:`decode_message` and :class:`Message`. Extend it with
#: :func:`register_kind`; read it as ``wire.ALLOWED_KINDS`` (the name is rebound on extension).
ALLOWED_KINDS: frozenset[str] = frozenset(
    {
        "value",
        "done",
        "abort",
        "token",
        # token hand-off (coordinator_free/engine/token.py)
        "token_ack",
        "token_commit",
        "token_abort",
        "token_fwd",
        "token_nack",
        "token_query",
        "token_taken",
        "walk_end",
        # decor seed exchange and pair drops (coordinator_free/families/decor/node.py)
        "decor_pub",
        "decor_drop",
    }
)


class WireError(ValueError):
    """Bytes or fields that do not form a valid message envelope."""


def register_kind(kind: str) -> None:
    """Allow messages of ``kind`` (a short lower-case identifier). Idempotent."""
    global ALLOWED_KINDS
    if not isinstance(kind, str) or not _KIND_RE.fullmatch(kind):
        raise WireError(
            f"kind {kind!r} is not a short identifier (lower-case letter, then up to 31 of "
            "[a-z0-9_])"
        )
    if kind not in ALLOWED_KINDS:
        ALLOWED_KINDS = ALLOWED_KINDS | {kind}


def _check_kind(kind: Any) -> str:
    if type(kind) is str and kind in ALLOWED_KINDS:  # registered kinds are valid identifiers
        return kind
    if not isinstance(kind, str):
        raise WireError(f"field 'kind' must be a string, got {type(kind).__name__}")
    if not _KIND_RE.fullmatch(kind):
        raise WireError(f"field 'kind' {kind[:40]!r} is not a short identifier")
    if kind not in ALLOWED_KINDS:
        raise WireError(
            f"field 'kind' {kind!r} is not a registered message kind "
            f"(known: {', '.join(sorted(ALLOWED_KINDS))})"
        )
    return kind


def _check_counter(name: str, value: Any) -> int:
    if type(value) is int and 0 <= value <= MAX_STEP:  # the common case, first
        return value
    if isinstance(value, np.integer) and not isinstance(value, np.bool_):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(f"field {name!r} must be an integer, got {type(value).__name__}")
    if not 0 <= value <= MAX_STEP:
        raise WireError(f"field {name!r} must be in 0..2**63-1, got {value}")
    return value


def _check_payload(payload: Any) -> np.ndarray | None:
    if payload is None:
        return None
    if type(payload) is np.ndarray and payload.dtype is codec.FLOAT64 and payload.ndim == 1:
        return payload  # the common case (a float64 vector), first
    if not isinstance(payload, np.ndarray):
        raise WireError(
            f"field 'payload' must be a numpy array or None, got {type(payload).__name__}"
        )
    dtype = payload.dtype
    if dtype.byteorder == ">":
        dtype = dtype.newbyteorder("<")
    if dtype.str not in codec.ALLOWED_DTYPES:
        raise WireError(
            f"field 'payload' has dtype {payload.dtype.str!r}; allowed: "
            f"{', '.join(sorted(codec.ALLOWED_DTYPES))}"
        )
    if payload.ndim == 0:
        # The codec encodes through np.ascontiguousarray, which turns 0-d arrays into shape (1,).
        raise WireError("field 'payload' is a 0-d array; send shape (1,) instead")
    if payload.ndim > codec.MAX_ARRAY_DIMS:
        raise WireError(
            f"field 'payload' has {payload.ndim} dimensions; at most {codec.MAX_ARRAY_DIMS}"
        )
    return payload


def _plain(value: Any, where: str, depth: int) -> Any:
    """A normalised copy of a plain meta value; WireError naming ``where`` otherwise."""
    if value is None or isinstance(value, str | bytes):
        return value
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        value = int(value)
        if not _INT_MIN <= value <= _INT_MAX:
            raise WireError(f"{where} integer {value} is outside the 64-bit range")
        return value
    if isinstance(value, float | np.floating):
        return float(value)
    if isinstance(value, list | tuple | Mapping):
        if depth >= MAX_META_DEPTH:
            raise WireError(f"{where} nests deeper than {MAX_META_DEPTH} levels")
        if isinstance(value, Mapping):
            return _plain_map(value, where, depth + 1)
        return [_plain(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise WireError(
        f"{where} has type {type(value).__name__}; meta holds only None, bool, int, float, str, "
        "bytes, lists and str-keyed maps"
    )


def _plain_map(value: Mapping, where: str, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise WireError(f"{where} has a key of type {type(k).__name__}; keys must be str")
        out[k] = _plain(v, f"{where}[{k[:40]!r}]", depth)
    return out


def _check_meta(meta: Any) -> dict[str, Any]:
    if type(meta) is dict and not meta:
        return {}
    if not isinstance(meta, Mapping):
        raise WireError(f"field 'meta' must be a map, got {type(meta).__name__}")
    return _plain_map(meta, "field 'meta'", 0)


def _canonical(arr: np.ndarray) -> np.ndarray:
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False)


@dataclass(frozen=True)
class Message:
    """One protocol message. Fields are validated on construction (:class:`WireError`).

    ``round``/``step`` accept numpy integers (stored as ``int``); ``meta`` is copied into a plain
    dict (tuples become lists, numpy scalars become Python numbers), so later changes to the
    caller's dict do not alter the message. Equality compares payloads bit for bit (dtype, shape
    and bytes, so NaN equals NaN), after normalising byte order.
    """

    kind: str
    round: int
    step: int
    payload: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _check_kind(self.kind))
        object.__setattr__(self, "round", _check_counter("round", self.round))
        object.__setattr__(self, "step", _check_counter("step", self.step))
        object.__setattr__(self, "payload", _check_payload(self.payload))
        object.__setattr__(self, "meta", _check_meta(self.meta))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        if (self.kind, self.round, self.step, self.meta) != (
            other.kind,
            other.round,
            other.step,
            other.meta,
        ):
            return False
        a, b = self.payload, other.payload
        if a is None or b is None:
            return a is None and b is None
        a, b = _canonical(a), _canonical(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

    __hash__ = None  # type: ignore[assignment]  # payload and meta are mutable containers


_PREFIXES: dict[tuple, bytes] = {}


def _array_prefix(dtype: str, shape: tuple[int, ...], nbytes: int) -> bytes:
    """The bytes before an array's data: the ext 32 marker (0xc9, big-endian u32 length, type
    code: valid msgpack for any length) and the [dtype, shape] header. A run sends arrays of a
    few shapes over and over: they are kept (at most 256)."""
    key = (dtype, shape)
    prefix = _PREFIXES.get(key)
    if prefix is None:
        header = msgpack.packb([dtype, list(shape)])
        body_len = len(header) + nbytes
        if body_len > 0xFFFFFFFF:
            raise WireError(f"field 'payload' has {nbytes} bytes, too large for one message")
        prefix = b"\xc9" + body_len.to_bytes(4, "big") + bytes([codec.ARRAY_EXT]) + header
        if len(_PREFIXES) >= 256:
            _PREFIXES.clear()
        _PREFIXES[key] = prefix
    return prefix


def encode_message(msg: Message, *, max_size: int = MAX_MESSAGE_SIZE) -> bytes:
    """The envelope bytes of ``msg``; :class:`WireError` if they would exceed ``max_size``."""
    if not isinstance(msg, Message):
        raise TypeError(f"expected a Message, got {type(msg).__name__}")
    if msg.payload is not None and msg.payload.nbytes > max_size:
        raise WireError(
            f"field 'payload' has {msg.payload.nbytes} bytes, over the message limit {max_size}"
        )
    data = b"".join(encode_parts(msg))
    if len(data) > max_size:
        raise WireError(f"encoded message is {len(data)} bytes, over the limit {max_size}")
    return data


def encode_parts(msg: Message) -> list[bytes | memoryview]:
    """The envelope of ``msg`` as pieces to be written back to back: the payload's data is
    the last piece, a view on the array itself (nothing copied; a non-contiguous or
    big-endian array is converted first). ``b"".join`` of them is :func:`encode_message`."""
    # The envelope is a 6-entry map whose last entry is the payload. The first five entries go
    # through the codec (or, with no meta, the cached bytes of the same encoding); the array
    # extension is written here, so the array's bytes are never copied.
    if msg.meta:
        head = codec.pack(
            {
                "v": WIRE_VERSION,
                "kind": msg.kind,
                "round": msg.round,
                "step": msg.step,
                "meta": msg.meta,
            }
        )
        assert head[0] == 0x85  # fixmap with 5 entries
        parts: list[bytes | memoryview] = [b"\x86", memoryview(head)[1:], _PAYLOAD_KEY]
    elif msg.payload is not None:
        arr = np.ascontiguousarray(msg.payload)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        head, step_width, prefix = _aligned_layout(
            msg.kind, msg.round, uint_size(msg.step), arr.dtype.str, arr.shape, arr.nbytes
        )
        parts = [head, pack_uint(msg.step, step_width), prefix]
        if arr.nbytes:
            parts.append(codec.raw_bytes(arr))
        return parts
    else:
        parts = [_head_prefix(msg.kind, msg.round), codec.pack(msg.step), _NO_META_PAYLOAD_KEY]
    if msg.payload is None:
        parts.append(b"\xc0")  # nil
    else:
        arr = np.ascontiguousarray(msg.payload)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        parts.append(_array_prefix(arr.dtype.str, arr.shape, arr.nbytes))
        if arr.nbytes:
            parts.append(codec.raw_bytes(arr))
    return parts


_LAYOUTS: dict[tuple, tuple[bytes, int, bytes]] = {}


def _aligned_layout(
    kind: str, round_: int, step_min: int, dtype: str, shape: tuple[int, ...], nbytes: int
) -> tuple[bytes, int, bytes]:
    """``(head, step width, prefix)`` of an envelope without meta whose payload's data starts
    at a multiple of 8 bytes from the envelope's start: the round, the step and the first
    dimension of the shape are written in longer integer encodings where that aligns the data
    (still plain msgpack, decoded alike). A receiver whose plaintext starts aligned (a new
    bytes object) then uses the array where it lies instead of copying it to align it. Kept
    per kind, round, step size and array layout (at most 256)."""
    key = (kind, round_, step_min, dtype, shape)
    got = _LAYOUTS.get(key)
    if got is not None:
        return got
    dims = [uint_size(d) for d in shape]
    head_fixed = len(_head_prefix(kind, 0)) - 1  # without the round's own bytes (fixint 0)
    dtype_bytes = msgpack.packb(dtype)
    if len(shape) > 15:
        raise WireError(f"field 'payload' has {len(shape)} dimensions")
    # The data offset: head, round, step, meta + payload key, ext 32 header (6), the array
    # header (fixarray, dtype, fixarray, dims).
    base = head_fixed + len(_NO_META_PAYLOAD_KEY) + 6 + 1 + len(dtype_bytes) + 1 + sum(dims[1:])
    best = None
    round_min = uint_size(round_)
    first_min = dims[0] if dims else 0
    # The version (fixint 1) and the round each take every width from 1 byte up: together
    # they reach every remainder mod 8, so the data is always aligned.
    for wv in UINT_SIZES:
        for wr in (w for w in UINT_SIZES if w >= round_min):
            for ws in (w for w in UINT_SIZES if w >= step_min):
                for wd in (w for w in UINT_SIZES if w >= first_min) if dims else (0,):
                    extra = (wv - 1) + (wr - round_min) + (ws - step_min) + (wd - first_min)
                    if (base + wv - 1 + wr + ws + wd) % 8 == 0 and (
                        best is None or extra < best[0]
                    ):
                        best = (extra, wv, wr, ws, wd)
    if best is None:  # pragma: no cover - the version and the round always reach it
        best = (0, 1, round_min, step_min, first_min)
    _, wv, wr, ws, wd = best
    # _head_prefix(kind, 0): map, "v", 1, "kind", kind, "round", 0, "step".
    head = _head_prefix(kind, 0)
    cut = head.rindex(msgpack.packb("step"))
    v_at = 1 + len(msgpack.packb("v"))
    head = (
        head[:v_at]
        + pack_uint(WIRE_VERSION, wv)
        + head[v_at + 1 : cut - 1]
        + pack_uint(round_, wr)
        + head[cut:]
    )
    array_header = (
        b"\x92"
        + dtype_bytes
        + bytes((0x90 | len(shape),))
        + b"".join(pack_uint(d, wd if i == 0 else dims[i]) for i, d in enumerate(shape))
    )
    body_len = len(array_header) + nbytes
    if body_len > 0xFFFFFFFF:
        raise WireError(f"field 'payload' has {nbytes} bytes, too large for one message")
    prefix = (
        _NO_META_PAYLOAD_KEY
        + b"\xc9"
        + body_len.to_bytes(4, "big")
        + bytes((codec.ARRAY_EXT,))
        + array_header
    )
    got = (head, ws, prefix)
    if len(_LAYOUTS) >= 256:
        _LAYOUTS.clear()
    _LAYOUTS[key] = got
    return got


_HEADS: dict[tuple[str, int], bytes] = {}
#: The envelope's empty meta and the payload key, after the step.
_NO_META_PAYLOAD_KEY = msgpack.packb("meta") + b"\x80" + _PAYLOAD_KEY


def _head_prefix(kind: str, round_: int) -> bytes:
    """The envelope's bytes up to the step's value (``{"v": 1, "kind", "round", "step":``),
    as :func:`codec.pack` writes them, kept per kind and round (at most 256)."""
    key = (kind, round_)
    head = _HEADS.get(key)
    if head is None:
        head = (
            b"\x86"
            + msgpack.packb("v")
            + msgpack.packb(WIRE_VERSION)
            + msgpack.packb("kind")
            + msgpack.packb(kind)
            + msgpack.packb("round")
            + msgpack.packb(round_)
            + msgpack.packb("step")
        )
        if len(_HEADS) >= 256:
            _HEADS.clear()
        _HEADS[key] = head
    return head


def decode_message(
    data: bytes | bytearray | memoryview, *, max_size: int = MAX_MESSAGE_SIZE
) -> Message:
    """Parse envelope bytes strictly; every defect raises :class:`WireError`."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    if len(data) > max_size:
        raise WireError(f"message of {len(data)} bytes exceeds the limit {max_size}")
    if type(data) is bytes:
        msg = _decode_canonical(data)
        if msg is not None:
            return msg
    try:
        obj = codec.unpack(data)
    except codec.CodecError as exc:
        raise WireError(f"not a valid envelope: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError(f"envelope must be a map, got {type(obj).__name__}")
    if "v" not in obj:
        raise WireError("envelope has no version field 'v'")
    version = obj["v"]
    if type(version) is not int or version != WIRE_VERSION:
        raise WireError(
            f"field 'v' is {repr(version)[:40]}; this node speaks version {WIRE_VERSION}"
        )
    if obj.keys() != _FIELDS:
        keys = set(obj)
        missing = _FIELDS - keys
        if missing:
            raise WireError(f"envelope lacks field(s) {', '.join(sorted(map(repr, missing)))}")
        shown = ", ".join(sorted(repr(k)[:40] for k in keys - _FIELDS))
        raise WireError(f"envelope has unknown field(s) {shown}")
    meta = obj["meta"]
    if not isinstance(meta, dict):
        raise WireError(f"field 'meta' must be a map, got {type(meta).__name__}")
    for name in ("round", "step"):
        value = obj[name]
        if type(value) is not int:  # rejects bool, which msgpack keeps distinct from int
            raise WireError(f"field {name!r} must be an integer, got {type(value).__name__}")
    payload = obj["payload"]
    if payload is not None and not isinstance(payload, np.ndarray):
        raise WireError(f"field 'payload' must be an array or nil, got {type(payload).__name__}")
    # Every field checked as Message() checks it, without its copy of an empty meta.
    msg = object.__new__(Message)
    setattr_ = object.__setattr__
    setattr_(msg, "kind", _check_kind(obj["kind"]))
    setattr_(msg, "round", _check_counter("round", obj["round"]))
    setattr_(msg, "step", _check_counter("step", obj["step"]))
    setattr_(msg, "payload", _check_payload(payload))
    setattr_(msg, "meta", _check_meta(meta) if meta else {})
    return msg


_MAP_V = b"\x86" + msgpack.packb("v")
_KEY_KIND = msgpack.packb("kind")
_KEY_ROUND = msgpack.packb("round")
_KEY_STEP = msgpack.packb("step")


def _uint_at(data: bytes, pos: int) -> tuple[int, int] | None:
    """A msgpack unsigned integer at ``pos`` (positive fixint or uint 8..64): (value, end)."""
    c = data[pos]
    if c < 0x80:
        return c, pos + 1
    size = UINT_LENGTHS.get(c)
    if size is None:
        return None
    end = pos + 1 + size
    return int.from_bytes(data[pos + 1 : end], "big"), end


#: What the envelopes of the array messages decoded so far share: ``(before, after, kind,
#: round, dtype, shape, nbytes)``, where ``before`` is every byte up to the step's value and
#: ``after`` every byte between it and the array's data. A run sends messages of a few kinds
#: and shapes over and over: an envelope that starts with ``before`` and continues with
#: ``after`` right after a step, and holds exactly ``nbytes`` after it, is the same message
#: with another step and other data.
_TEMPLATES: list[tuple] = []


def _decode_templated(data: bytes) -> Message | None:
    """The message of an envelope that matches a template (:data:`_TEMPLATES`), else None."""
    for before, after, kind, round_, dt, shape, nbytes in _TEMPLATES:
        if not data.startswith(before):
            continue
        got = _uint_at(data, len(before)) if len(data) > len(before) + 8 else None
        if got is None:
            return None
        step, pos = got
        start = pos + len(after)
        if step > MAX_STEP or not data.startswith(after, pos) or len(data) - start != nbytes:
            continue
        payload = np.frombuffer(data, dtype=dt, offset=start)
        if len(shape) != 1:
            payload = payload.reshape(shape)
        return _checked(kind, round_, step, payload)
    return None


def _decode_canonical(data: bytes) -> Message | None:
    """The message of an envelope laid out exactly as :func:`encode_message` writes it with
    no meta (the fields in order, ``meta`` empty, the payload nil or an ext 32 array), read in
    place: the payload is a read-only view on ``data``, never copied. None for any other
    layout, which the general path then parses and judges (the same message, or the error)."""
    if _TEMPLATES:
        msg = _decode_templated(data)
        if msg is not None:
            return msg
    try:
        if not data.startswith(_MAP_V):
            return None
        got = _uint_at(data, len(_MAP_V))
        if got is None or got[0] != WIRE_VERSION or not data.startswith(_KEY_KIND, got[1]):
            return None
        pos = got[1] + len(_KEY_KIND)
        n = data[pos] - 0xA0
        if not 0 <= n < 32:
            return None
        kind = data[pos + 1 : pos + 1 + n].decode("ascii")
        if kind not in ALLOWED_KINDS or len(kind) != n:
            return None
        pos += 1 + n
        if not data.startswith(_KEY_ROUND, pos):
            return None
        got = _uint_at(data, pos + len(_KEY_ROUND))
        if got is None:
            return None
        round_, pos = got
        if not data.startswith(_KEY_STEP, pos):
            return None
        step_at = pos + len(_KEY_STEP)
        got = _uint_at(data, step_at)
        if got is None:
            return None
        step, pos = got
        after_step = pos
        if round_ > MAX_STEP or step > MAX_STEP or not data.startswith(_NO_META_PAYLOAD_KEY, pos):
            return None
        pos += len(_NO_META_PAYLOAD_KEY)
        marker = data[pos]
        if marker == 0xC0:
            if pos + 1 != len(data):
                return None
            payload = None
        elif marker == 0xC9 and data[pos + 5] == codec.ARRAY_EXT:
            body = pos + 6
            if int.from_bytes(data[pos + 1 : pos + 5], "big") != len(data) - body:
                return None
            header = codec._canonical_header(data[body : body + codec._HEADER_MAX])
            if header is None:
                return None
            (dtype, shape), offset = header
            dt = codec._DTYPES.get(dtype)
            if dt is None or not 1 <= len(shape) <= codec.MAX_ARRAY_DIMS:
                return None
            start = body + offset
            if math.prod(shape) * dt.itemsize != len(data) - start:
                return None
            if len(data) > start:
                payload = np.frombuffer(data, dtype=dt, offset=start)
                if len(_TEMPLATES) >= 8:
                    _TEMPLATES.clear()
                _TEMPLATES.append(
                    (
                        data[:step_at],
                        data[after_step:start],
                        kind,
                        round_,
                        dt,
                        tuple(shape),
                        len(data) - start,
                    )
                )
            else:
                payload = np.empty(0, dtype=dt)
            if len(shape) != 1:
                payload = payload.reshape(shape)
        else:
            return None
    except (IndexError, UnicodeDecodeError):
        return None
    return _checked(kind, round_, step, payload)


def value_message(step: int, payload: np.ndarray) -> Message:
    """``Message(kind="value", round=0, step=step, payload=payload)``: a step's value, as a step
    engine sends it every step. A step that is a plain int in range and a 1-d float64 array
    (what the checks of :class:`Message` let through unchanged) skip the dataclass's
    constructor; anything else goes through it, and its checks."""
    if (
        type(step) is int
        and 0 <= step <= MAX_STEP
        and type(payload) is np.ndarray
        and payload.dtype is codec.FLOAT64
        and payload.ndim == 1
    ):
        return _checked("value", 0, step, payload)
    return Message(kind="value", round=0, step=step, payload=payload)


def _checked(kind: str, round_: int, step: int, payload: np.ndarray | None) -> Message:
    """A message without meta from fields the caller has checked as :class:`Message` checks
    them (a readers' shortcut past the dataclass's own checks)."""
    msg = object.__new__(Message)
    # The instance's attributes set at once (one call, not five): those the constructor sets.
    fields = {"kind": kind, "round": round_, "step": step, "payload": payload, "meta": {}}
    object.__setattr__(msg, "__dict__", fields)
    return msg
