"""View log: the append-only record of what one node observed, and its reader.

Every node writes one view log. It holds exactly what the node saw and sent, plus the public
parameters of the run, and never its secrets (private keys, pair seeds, its own noise). The
offline auditor replays it, so the format favours being able to tell precisely what survived a
crash over everything else.

File layout
-----------
::

    magic     8 bytes   b"CFVLOG1\\n"
    record*   4 bytes   payload length, unsigned big-endian (at most MAX_RECORD_BYTES)
              4 bytes   CRC-32 (zlib.crc32) of the payload, unsigned big-endian
              n bytes   payload = codec.pack(dict)

The first record is the header::

    {"k": "header", "format": "cfree-viewlog", "version": 1, "run_id": str, "node": int,
     "params": {...}, "t_mono": float, "t_wall": float}

and every later record is::

    {"k": kind, "seq": int, "t_mono": time.monotonic(), "t_wall": time.time(), **fields}

with ``seq`` counting 0, 1, 2, ... across the whole file. A writer that resumes an existing log
(``append=True``) writes a ``"resume"`` record and carries on the same sequence.

A record that names a vector (``send``, ``recv``, ``late``, the token records) carries its
``digest`` (:func:`value_digest`): ``"blake3:"`` and 32 hex digits. Logs written before
BLAKE3 carry the first 128 bits of SHA-256 (32 hex digits, no prefix); a digest recomputed to
check a logged one takes the logged one's form (:func:`digest_like`), and a record that holds a
value without its digest is checked in both forms (:func:`both_digests`, :func:`same_digest`), so
both kinds of logs audit alike. The logs of one run are expected to share a form: a value its
sender's log names in one form and its receiver's in the other is a ``digest-mismatch``.

A record goes to the operating system as soon as it is made, or, when the writer holds records
(:meth:`ViewLogWriter.hold`, as a peer does while it handles the events that arrived together),
with the others held, in one vectored write before the node sends anything and before it waits
on anything (the network, a timer, a socket): a step's recv records in one write, its send
records in another. An array of 4 KiB or more (a logged value)
is written from its own memory, never copied into the record first; the record's bytes are the
codec's encoding of the record with its large arrays moved to the end of the map, so the file
format is unchanged. A crash of the node loses at most the records not yet handed over: the
one being written, or those of the events being handled. The reader reports such a torn tail (its
offset and size) and returns every record before it. A checksum mismatch means the length
fields after it can no longer be trusted, so reading stops there, with the offset named. A
record whose checksum matches but whose payload does not decode is reported and skipped: its
frame is intact, so the records after it are still trustworthy.

A log that grows fast (every received value of a large vector) keeps little of itself in the
page cache: each time it has grown by 8 MiB, the pages more than :data:`DROP_BEHIND` behind its
end are advised out (``posix_fadvise(DONTNEED)``: the kernel writes them back, then drops them).
The writer never reads them again, and a 16-node ring of 1 MiB values with every value logged
ran 25 % faster so (fresh page-cache pages cost more than reused ones; docs/benchmarks.md). What
the file holds, and what a crash loses, do not change; a reader reads the pages back from disk.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from blake3 import blake3

from coordinator_free.codec import (
    ALLOWED_DTYPES,
    ARRAY_EXT,
    FLOAT64,
    UINT_MARKERS,
    CodecError,
    pack,
    pack_uint,
    raw_bytes,
    uint_size,
    unpack,
)
from coordinator_free.errors import CfreeError

try:
    # zlib's CRC-32, bit for bit, from ISA-L: about ten times faster on large values (a 1 MiB
    # record's checksum took 0.25-0.43 ms with zlib here, 0.03 ms with ISA-L).
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; without it, zlib's own
    crc32 = zlib.crc32

try:  # POSIX advisory locks keep two processes from writing one log.
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

MAGIC = b"CFVLOG1\n"
FORMAT = "cfree-viewlog"
VERSION = 1
MAX_RECORD_BYTES = 256 * 1024 * 1024
FRAME = struct.Struct(">II")
_IOV_MAX = 1024  # pieces per writev (the Linux and BSD limit)
#: The pages of a view log this far behind its end leave the page cache (module doc)...
DROP_BEHIND = 8 << 20
#: ... advised each time the log has grown by this much.
_DROP_STEP = 8 << 20

#: Field names that must never appear in a view log, at any nesting depth (case-insensitive).
FORBIDDEN_FIELDS = frozenset(
    {
        "private_key",
        "secret",
        "seed_secret",
        "noise",
        "own_noise",
        "key",
        "pair_seed",
        "pair_key",
        "shared_secret",
        "password",
    }
)
#: Field names the writer fills in itself.
RESERVED_FIELDS = frozenset({"k", "seq", "t_mono", "t_wall"})
#: Record kinds the writer emits itself.
RESERVED_KINDS = frozenset({"header", "resume"})
#: The kinds of value record :meth:`ViewLogWriter.write_value` writes without a check of the
#: kind (any other kind goes through :meth:`ViewLogWriter.write_record`'s checks).
VALUE_KINDS = frozenset({"send", "recv"})


class ViewLogError(CfreeError, ValueError):
    """A view log cannot be opened for writing as asked (wrong file, locked, damaged)."""


@dataclass(frozen=True)
class LogProblem:
    """Something wrong found while reading a view log, at byte ``offset`` of the file.

    ``kind`` is one of ``"torn-tail"``, ``"bad-checksum"``, ``"bad-record"``, ``"bad-magic"``,
    ``"missing-header"``, ``"bad-header"``, ``"seq-gap"``, ``"seq-duplicate"``.
    """

    offset: int
    kind: str
    message: str

    def __str__(self) -> str:
        return f"offset {self.offset}: {self.kind}: {self.message}"


@dataclass
class ViewLog:
    """Everything readable from one view log file.

    ``records`` excludes the header; ``offsets[i]`` is the byte offset of ``records[i]``.
    ``valid_end`` is the offset just past the last record whose frame was intact.
    """

    path: Path
    header: dict | None
    records: list[dict]
    problems: list[LogProblem]
    offsets: list[int] = field(default_factory=list)
    size: int = 0
    valid_end: int = 0

    @property
    def intact(self) -> bool:
        return not self.problems

    def of_kind(self, kind: str) -> list[dict]:
        """The records whose ``"k"`` is ``kind``, in file order."""
        return [r for r in self.records if r.get("k") == kind]


# --------------------------------------------------------------------------------------------
# Reading


def iter_records(
    path: str | os.PathLike, problems: list[LogProblem] | None = None
) -> Iterator[tuple[int, dict]]:
    """Yield ``(offset, record)`` for every decodable record, the header included.

    This checks framing only (magic, lengths, checksums, decoding); :func:`read_viewlog` adds
    the header and sequence checks. With ``problems`` given, problems are appended to it and
    reading goes on where it safely can. Without it, the first problem raises
    :class:`ViewLogError`. A missing file raises :class:`FileNotFoundError`.
    """
    scan = _Scan(path, problems)
    for offset, _end, record in scan:
        yield offset, record


class _Scan:
    """One pass over a view log's frames; remembers where the intact frames end."""

    def __init__(self, path: str | os.PathLike, problems: list[LogProblem] | None) -> None:
        self.path = path
        self.problems = problems
        self.size = 0
        self.valid_end = 0

    def _report(self, offset: int, kind: str, message: str) -> None:
        problem = LogProblem(offset, kind, message)
        if self.problems is None:
            raise ViewLogError(f"view log {os.fspath(self.path)}: {problem}")
        self.problems.append(problem)

    def __iter__(self) -> Iterator[tuple[int, int, dict]]:
        report = self._report
        with open(self.path, "rb") as f:
            size = self.size = os.fstat(f.fileno()).st_size
            magic = f.read(len(MAGIC))
            if magic != MAGIC:
                if len(magic) < len(MAGIC) and MAGIC.startswith(magic):
                    if magic:
                        report(
                            0,
                            "torn-tail",
                            f"file ends inside the magic ({len(magic)} of {len(MAGIC)} bytes)",
                        )
                    return
                if magic[:6] == MAGIC[:6]:
                    report(0, "bad-magic", f"unsupported view log version (magic {magic!r})")
                else:
                    report(0, "bad-magic", f"not a view log (starts with {magic[:16]!r})")
                return
            offset = self.valid_end = len(MAGIC)
            while offset < size:
                frame = f.read(FRAME.size)
                if len(frame) < FRAME.size:
                    report(
                        offset,
                        "torn-tail",
                        f"file ends inside a record frame ({len(frame)} of {FRAME.size} "
                        f"frame bytes present; {len(frame)} bytes after the last complete "
                        "record)",
                    )
                    return
                length, crc = FRAME.unpack(frame)
                if length > MAX_RECORD_BYTES:
                    report(
                        offset,
                        "bad-record",
                        f"record length {length} exceeds the limit {MAX_RECORD_BYTES}; "
                        "the frame is corrupt, reading stops here",
                    )
                    return
                present = size - offset
                if FRAME.size + length > present:
                    report(
                        offset,
                        "torn-tail",
                        f"record is incomplete ({present} of {FRAME.size + length} bytes "
                        f"present; {present} bytes after the last complete record): the "
                        "writer stopped mid-record, or the length field is corrupt",
                    )
                    return
                payload = f.read(length)
                if len(payload) != length:  # the file shrank while being read
                    report(offset, "torn-tail", "file shrank while being read")
                    return
                if crc32(payload) != crc:
                    report(
                        offset,
                        "bad-checksum",
                        f"checksum mismatch in the record of {length} bytes; nothing from "
                        "this offset on can be trusted, reading stops here",
                    )
                    return
                record_offset = offset
                offset = self.valid_end = offset + FRAME.size + length
                try:
                    record = unpack(payload, max_size=MAX_RECORD_BYTES)
                except CodecError as exc:
                    report(record_offset, "bad-record", f"undecodable record skipped: {exc}")
                    continue
                if not isinstance(record, dict) or not isinstance(record.get("k"), str):
                    report(
                        record_offset,
                        "bad-record",
                        "record skipped: expected a map with a string 'k', got "
                        f"{type(record).__name__}",
                    )
                    continue
                yield record_offset, offset, record


def read_viewlog(path: str | os.PathLike) -> ViewLog:
    """Read a whole view log. Never raises on bad content; every problem is in ``.problems``.

    Raises :class:`FileNotFoundError` (naming the path) when the file does not exist.
    """
    path = Path(path)
    problems: list[LogProblem] = []
    header: dict | None = None
    records: list[dict] = []
    offsets: list[int] = []
    first = True
    expected_seq = 0
    scan = _Scan(path, problems)

    for offset, _end, record in scan:
        kind = record["k"]
        if first:
            first = False
            if kind == "header":
                header = record
                problems.extend(_header_problems(offset, record))
                continue
            problems.append(
                LogProblem(offset, "missing-header", f"first record is {kind!r}, not a header")
            )
        if kind == "header":
            problems.append(LogProblem(offset, "bad-record", "a second header record"))
        else:
            seq = record.get("seq")
            if not isinstance(seq, int) or isinstance(seq, bool):
                problems.append(
                    LogProblem(offset, "bad-record", f"{kind!r} record has no integer 'seq'")
                )
            elif seq > expected_seq:
                missing = (
                    f"seq {expected_seq}"
                    if seq == expected_seq + 1
                    else f"seqs {expected_seq}..{seq - 1}"
                )
                problems.append(
                    LogProblem(offset, "seq-gap", f"{missing} missing before seq {seq}")
                )
                expected_seq = seq + 1
            elif seq < expected_seq:
                problems.append(
                    LogProblem(
                        offset,
                        "seq-duplicate",
                        f"seq {seq} repeats or goes back (expected {expected_seq})",
                    )
                )
            else:
                expected_seq = seq + 1
        records.append(record)
        offsets.append(offset)

    if first and not any(p.kind == "bad-magic" for p in problems):
        if scan.size == 0:
            problems.append(LogProblem(0, "missing-header", "file is empty"))
        else:
            problems.append(
                LogProblem(scan.valid_end, "missing-header", "no complete record in the file")
            )
    problems.sort(key=lambda p: p.offset)
    return ViewLog(
        path=path,
        header=header,
        records=records,
        problems=problems,
        offsets=offsets,
        size=scan.size,
        valid_end=scan.valid_end,
    )


def _header_problems(offset: int, header: dict) -> list[LogProblem]:
    problems = []
    if header.get("format") != FORMAT:
        problems.append(
            LogProblem(offset, "bad-header", f"format is {header.get('format')!r}, not {FORMAT!r}")
        )
    if header.get("version") != VERSION:
        problems.append(
            LogProblem(
                offset,
                "bad-header",
                f"version {header.get('version')!r} is not supported (this reader knows {VERSION})",
            )
        )
    if not isinstance(header.get("run_id"), str):
        problems.append(LogProblem(offset, "bad-header", "header has no string 'run_id'"))
    node = header.get("node")
    if not isinstance(node, int) or isinstance(node, bool):
        problems.append(LogProblem(offset, "bad-header", "header has no integer 'node'"))
    if not isinstance(header.get("params"), dict):
        problems.append(LogProblem(offset, "bad-header", "header has no 'params' map"))
    return problems


# --------------------------------------------------------------------------------------------
# Writing


_LEAVES = frozenset({str, int, float, bool, bytes, type(None)})


#: Map keys already found acceptable (strings that name no secret), so not checked again.
_SAFE_NAMES: set = set()


def _check_name(key: Any, where: str) -> None:
    if not isinstance(key, str):
        raise ValueError(
            f"{where}: map key {key!r} is a {type(key).__name__}; view log map keys "
            "must be strings (convert it with str())"
        )
    if key.lower() in FORBIDDEN_FIELDS:
        raise ValueError(
            f"{where}.{key}: field name {key!r} suggests a secret; the view log must "
            "never hold secrets (private keys, pair seeds, own noise)"
        )


def check_fields(value: Any, where: str = "fields") -> None:
    """Refuse secret-looking field names and non-string map keys, at any depth.

    Raises :class:`ValueError` naming the path to the offending field.
    """
    if type(value) in _LEAVES or type(value) is np.ndarray:  # told apart without ABC checks
        return
    if type(value) is dict:  # the common map: names seen before, checked once
        safe = _SAFE_NAMES
        for key, item in value.items():
            if key not in safe:
                _check_name(key, where)
                if len(safe) < 4096:
                    safe.add(key)
            if type(item) not in _LEAVES and type(item) is not np.ndarray:
                check_fields(item, f"{where}.{key}")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_name(key, where)
            check_fields(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_fields(item, f"{where}[{i}]")


def _encode(record: dict) -> bytes:
    return b"".join(_encode_parts(record))


def _ext_header(body_len: int) -> bytes:
    """The msgpack extension header of an array body of ``body_len`` bytes, as msgpack itself
    writes it (fixext for 1, 2, 4, 8, 16 bytes, else ext 8 / 16 / 32)."""
    code = ARRAY_EXT.to_bytes(1, "big")
    fixed = _FIXEXT.get(body_len)
    if fixed is not None:
        return fixed + code
    if body_len < 0x100:
        return b"\xc7" + body_len.to_bytes(1, "big") + code
    if body_len < 0x10000:
        return b"\xc8" + body_len.to_bytes(2, "big") + code
    return b"\xc9" + body_len.to_bytes(4, "big") + code


#: Arrays of at least this many bytes are written from their own memory; smaller ones are
#: packed with the record (a copy costs less than a separate piece).
_BY_VIEW = 4096
_FIXEXT = {1: b"\xd4", 2: b"\xd5", 4: b"\xd6", 8: b"\xd7", 16: b"\xd8"}
_ARRAY_HEADERS: dict[tuple, bytes] = {}


def _array_parts(key: str, arr: np.ndarray) -> list:
    """The msgpack bytes of ``key: arr`` (the codec's array extension) as pieces: the array's
    data is a view on its own memory, never copied. The same bytes :func:`codec.pack` writes."""
    arr = np.require(arr, requirements="C")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    dtype = arr.dtype.str
    if dtype not in ALLOWED_DTYPES:
        raise TypeError(f"array dtype {dtype} cannot be encoded")
    shape = arr.shape
    header = _ARRAY_HEADERS.get((dtype, shape))
    if header is None:
        header = msgpack.packb([dtype, list(shape)])
        if len(_ARRAY_HEADERS) >= 64:
            _ARRAY_HEADERS.clear()
        _ARRAY_HEADERS[(dtype, shape)] = header
    return [pack(key) + _ext_header(len(header) + arr.nbytes) + header, raw_bytes(arr)]


def _map_header(count: int) -> bytes:
    if count < 16:
        return bytes([0x80 | count])
    if count < 0x10000:
        return b"\xde" + count.to_bytes(2, "big")
    return b"\xdf" + count.to_bytes(4, "big")


def _encode_parts(record: dict) -> list:
    """A record's frame as pieces for one vectored write: the frame header, the record's
    msgpack bytes and, for every array at the top level of the record, a view on the array's
    own memory (its data is never copied; the checksum runs over the pieces). The bytes are
    those of one :func:`codec.pack` of the record with its arrays moved to the end."""
    arrays = [k for k, v in record.items() if type(v) is np.ndarray and v.nbytes >= _BY_VIEW]
    try:
        if not arrays:
            payload = pack(record)
            if len(payload) > MAX_RECORD_BYTES:
                raise ValueError(
                    f"{record.get('k')!r} record is {len(payload)} bytes, over the limit "
                    f"{MAX_RECORD_BYTES}"
                )
            return [FRAME.pack(len(payload), crc32(payload)) + payload]
        else:
            rest = {k: v for k, v in record.items() if type(v) is not np.ndarray}
            head = pack(rest)
            first = head[0]
            skip = 1 if first & 0xF0 == 0x80 else 3 if first == 0xDE else 5
            pieces = [_map_header(len(record)), memoryview(head)[skip:]]
            for k in arrays:
                pieces.extend(_array_parts(k, record[k]))
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"cannot encode {record.get('k')!r} record: {exc}") from None
    except ValueError as exc:
        if "over the limit" in str(exc):
            raise
        raise ValueError(f"cannot encode {record.get('k')!r} record: {exc}") from None
    length = 0
    crc = 0
    for piece in pieces:
        length += len(piece)
        crc = crc32(piece, crc)
    if length > MAX_RECORD_BYTES:
        raise ValueError(
            f"{record.get('k')!r} record is {length} bytes, over the limit {MAX_RECORD_BYTES}"
        )
    pieces.insert(0, FRAME.pack(length, crc))
    return pieces


#: The fields of a value record (``send``, ``recv``: written at every step), in the order the
#: step engine writes them; :func:`_value_parts` encodes these directly.
_VALUE_FIELDS = ("step", "peer", "digest", "nbytes")
_VALUE_FIELDS_WITH_VALUE = (*_VALUE_FIELDS, "value")
_KEYS = {k: pack(k) for k in ("k", "seq", "t_mono", "t_wall", *_VALUE_FIELDS_WITH_VALUE)}
#: The struct format of a msgpack unsigned int after its marker, by the size of its encoding
#: (``codec.UINT_SIZES``): a record's head of one form (:func:`_value_record_parts`) packs
#: with these, the marker going with the constant bytes before it.
_UINT_FORMATS = {1: "B", 2: "B", 3: "H", 5: "I", 9: "Q"}
#: The heads of value records by form (:func:`_value_head`): (kind, peer, nbytes, the value's
#: length or 0, the encoded sizes of seq and step, the digest's length); a peer writes a few
#: forms (two kinds, one per neighbour, a size or two of its counters).
_VALUE_HEADS: dict[tuple, tuple] = {}
_VALUE_HEADS_MAX = 1024


def _uint_size(x: int) -> int | None:
    """``codec.uint_size`` of an int, None when msgpack has no unsigned form for it
    (negative, or past 64 bits)."""
    return uint_size(x) if 0 <= x < 0x10000000000000000 else None


def _uint(x) -> bytes | None:
    """msgpack's encoding of a non-negative int (the smallest form, as msgpack writes it)."""
    size = _uint_size(x) if type(x) is int else None
    return None if size is None else pack_uint(x, size)


def _value_head(kind: str, peer: int, nbytes: int, value, seq_s: int, step_s: int, nd: int):
    """How a value record of one form is packed: a :class:`struct.Struct` and the constant
    bytes between its variable fields, ``(packer, c1, c2, c3, c4, c5, c6)``, where the head is
    ``packer.pack(c1, seq, c2, t_mono, c3, t_wall, c4, step, c5, digest, c6)``: the map's
    header, ``k`` and the kind and the key ``seq`` (with the seq's marker), the two times, the
    key ``step`` (with its marker), ``peer`` and the key ``digest`` with the digest's string
    header (``nd`` ASCII characters), ``nbytes``, and the value's key and array extension
    header. None when ``peer`` or ``nbytes`` is not a msgpack unsigned int."""
    peer_b, nbytes_b = _uint(peer), _uint(nbytes)
    if peer_b is None or nbytes_b is None:
        return None
    seq_m, seq_f = UINT_MARKERS[seq_s], _UINT_FORMATS[seq_s]
    step_m, step_f = UINT_MARKERS[step_s], _UINT_FORMATS[step_s]
    header = b"\x88" if value is None else b"\x89"
    c1 = b"".join((header, _KEYS["k"], pack(kind), _KEYS["seq"], seq_m))
    c2, c3 = _KEYS["t_mono"] + b"\xcb", _KEYS["t_wall"] + b"\xcb"  # msgpack's float 64
    c4 = _KEYS["step"] + step_m
    c5 = b"".join((_KEYS["peer"], peer_b, _KEYS["digest"]))
    c5 += bytes((0xA0 | nd,)) if nd < 32 else bytes((0xD9, nd))
    c6 = _KEYS["nbytes"] + nbytes_b
    if value is not None:
        c6 += _array_parts("value", value)[0]
    fmt = f">{len(c1)}s{seq_f}{len(c2)}sd{len(c3)}sd{len(c4)}s{step_f}{len(c5)}s{nd}s{len(c6)}s"
    return struct.Struct(fmt), c1, c2, c3, c4, c5, c6


def _value_parts(kind: str, seq: int, t_mono: float, t_wall: float, fields: dict) -> list | None:
    """The frame pieces of a value record (``fields`` exactly ``step, peer, digest, nbytes``
    and optionally a 1-d float64 ``value``, in that order, as the step engine writes them at
    every step) built directly, without the general encoder: the same bytes as
    :func:`_encode_parts` of ``{"k", "seq", "t_mono", "t_wall", **fields}``. None for any other
    form of record (or one that must be refused), which then goes the general way."""
    keys = tuple(fields)
    if keys == _VALUE_FIELDS:
        value = None
    elif keys == _VALUE_FIELDS_WITH_VALUE:
        value = fields["value"]
        if value is None:  # a None value is a field like any other, for the general encoder
            return None
    else:
        return None
    step, peer, digest, nbytes = fields["step"], fields["peer"], fields["digest"], fields["nbytes"]
    return _value_record_parts(kind, seq, t_mono, t_wall, step, peer, digest, nbytes, value)


def value_fields(step, peer, digest, nbytes, value=None) -> dict:
    """The fields of a value record as a dict, in the order a record holds them (``value``
    only when it is not None)."""
    fields = {"step": step, "peer": peer, "digest": digest, "nbytes": nbytes}
    if value is not None:
        fields["value"] = value
    return fields


def _value_record_parts(
    kind: str, seq: int, t_mono: float, t_wall: float, step, peer, digest, nbytes, value
) -> list | None:
    """:func:`_value_parts` of the fields ``step, peer, digest, nbytes`` and, unless ``value``
    is None, ``value``, given one by one (:meth:`ViewLogWriter.write_value`). None when they
    are not plain unsigned ints, an ASCII digest of at most 255 characters and a non-empty
    contiguous 1-d float64 vector. A record's head is one packing of its form's
    :func:`_value_head`, built once per form and kept."""
    if value is None:
        size = 0
    elif (
        type(value) is not np.ndarray
        or value.dtype is not FLOAT64
        or value.ndim != 1
        or not value.size
        or not value.flags.c_contiguous
    ):
        return None
    else:
        size = len(value)
    # (a bool is no msgpack int)
    if type(peer) is not int or type(nbytes) is not int or type(step) is not int:
        return None
    if type(digest) is not str or len(digest) > 255 or not digest.isascii():
        return None
    # The encoded sizes of the common case (seq past 255, step below 65,536) without a call.
    seq_s = 3 if 0x100 <= seq < 0x10000 else _uint_size(seq)
    step_s = (2 if step < 0x100 else 3) if 0x80 <= step < 0x10000 else _uint_size(step)
    if seq_s is None or step_s is None:
        return None
    form = (kind, peer, nbytes, size, seq_s, step_s, len(digest))
    head = _VALUE_HEADS.get(form)
    if head is None:
        head = _value_head(kind, peer, nbytes, value, seq_s, step_s, len(digest))
        if head is None:
            return None
        if len(_VALUE_HEADS) < _VALUE_HEADS_MAX:
            _VALUE_HEADS[form] = head
    packer, c1, c2, c3, c4, c5, c6 = head
    head = packer.pack(c1, seq, c2, t_mono, c3, t_wall, c4, step, c5, digest.encode(), c6)
    if value is None:
        return [FRAME.pack(len(head), crc32(head)) + head]
    length = len(head) + 8 * size
    if length > MAX_RECORD_BYTES:
        return None
    if size < _BY_VIEW // 8:
        payload = head + value.tobytes()  # (a contiguous vector's bytes: its memory as it lies)
        return [FRAME.pack(length, crc32(payload)) + payload]
    data = raw_bytes(value)
    return [FRAME.pack(length, crc32(data, crc32(head))), head, data]


class ViewLogWriter:
    """Appends records to one node's view log.

    ``ViewLogWriter(path, run_id=..., node=..., params=...)`` creates the file and writes the
    header. It refuses an existing non-empty file (:class:`FileExistsError`) unless
    ``append=True``, which resumes that log: the file must be a view log of the same run and
    node; a torn final record (left by a crash) is cut off and the ``"resume"`` record notes how
    many bytes were dropped; any other damage is refused with :class:`ViewLogError` and the file
    is left untouched. A POSIX lock keeps a second writer off the same file.

    Each record is handed to the operating system as soon as it is written; ``fsync=True`` also
    forces the file to stable storage on :meth:`close` (and :meth:`sync` does so on demand).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        run_id: str,
        node: int,
        params: dict,
        append: bool = False,
        fsync: bool = False,
        mode: int = 0o644,
    ) -> None:
        if not isinstance(run_id, str) or not run_id:
            raise ValueError("run_id must be a non-empty string")
        if not isinstance(node, int) or isinstance(node, bool) or node < 0:
            raise ValueError(f"node must be a non-negative integer, got {node!r}")
        if not isinstance(params, Mapping):
            raise ValueError(f"params must be a dict, got {type(params).__name__}")
        check_fields(params, "params")
        self.path = Path(path)
        self.run_id = run_id
        self.node = node
        self._fsync = fsync
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._seq = 0
        self._size = 0
        self._broken: str | None = None
        self._held: list | None = None  # records kept for one vectored write (hold / flush)
        self._advised = 0  # the file's pages before this offset were advised out of the cache
        header = {
            "k": "header",
            "format": FORMAT,
            "version": VERSION,
            "run_id": run_id,
            "node": node,
            "params": dict(params),
            "t_mono": time.monotonic(),
            "t_wall": time.time(),
        }
        header_frame = _encode(header)  # fail before touching the file
        if append:
            self._open_for_append(header_frame, dict(params), mode)
        else:
            self._create(header_frame, mode)

    # -- opening ---------------------------------------------------------------------------

    def _create(self, header_frame: bytes, mode: int) -> None:
        flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            fd = os.open(self.path, flags)
            try:
                self._lock_file(fd)
                size = os.fstat(fd).st_size
                if size:
                    raise FileExistsError(
                        f"view log {self.path} already exists and holds {size} bytes; refusing "
                        "to overwrite it (move it away, or resume it with append=True)"
                    )
            except BaseException:
                os.close(fd)
                raise
        else:
            try:
                self._lock_file(fd)
            except BaseException:
                os.close(fd)
                raise
        self._fd = fd
        self._size = 0
        try:
            self._append_bytes(MAGIC + header_frame)
        except BaseException:
            self.close()
            raise

    def _open_for_append(self, header_frame: bytes, params: dict, mode: int) -> None:
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self.path, flags, mode)
        try:
            self._lock_file(fd)
            log = read_viewlog(self.path)
            fatal = [p for p in log.problems if p.kind not in ("torn-tail", "missing-header")]
            if fatal:
                raise ViewLogError(
                    f"cannot append to view log {self.path}: {fatal[0]}; the file is left as it is"
                )
            dropped = log.size - log.valid_end
            if log.header is None:
                if log.records:
                    raise ViewLogError(
                        f"cannot append to view log {self.path}: it has records but no header"
                    )
                # Nothing complete beyond (at most) the magic: start afresh.
                os.ftruncate(fd, 0)
                self._fd = fd
                self._size = 0
                self._append_bytes(MAGIC + header_frame)
                return
            if log.header.get("run_id") != self.run_id or log.header.get("node") != self.node:
                raise ViewLogError(
                    f"cannot append to view log {self.path}: it belongs to run "
                    f"{log.header.get('run_id')!r} node {log.header.get('node')!r}, not run "
                    f"{self.run_id!r} node {self.node}"
                )
            if dropped:
                os.ftruncate(fd, log.valid_end)
            self._fd = fd
            self._size = log.valid_end
            seqs = [r["seq"] for r in log.records if isinstance(r.get("seq"), int)]
            self._seq = max(seqs) + 1 if seqs else 0
        except BaseException:
            self._fd = None
            os.close(fd)
            raise
        self._write_record("resume", {"dropped_tail_bytes": dropped, "params": params})

    def _lock_file(self, fd: int) -> None:
        if fcntl is None:  # pragma: no cover - non-POSIX
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ViewLogError(
                f"view log {self.path} is being written by another process"
            ) from None

    # -- writing ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._fd is None

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next record will get."""
        return self._seq

    def write(self, kind: str, /, **fields: Any) -> int:
        """Append one record ``{"k": kind, "seq", "t_mono", "t_wall", **fields}``; return its seq.

        Values may be numbers, strings, bytes, None, bools, numpy arrays and nested
        dicts/lists of them. Raises :class:`ValueError` for secret-looking field names (at any
        depth), reserved names, non-string map keys and values that cannot be encoded; nothing
        is written then.
        """
        return self.write_record(kind, fields)

    def write_record(self, kind: str, fields: dict) -> int:
        """:meth:`write` with the fields as one dict (read while the record is written, never
        kept or changed): what a driver holding an engine's ``Log`` action calls."""
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"record kind must be a non-empty string, got {kind!r}")
        if kind in RESERVED_KINDS:
            raise ValueError(f"record kind {kind!r} is reserved for the writer itself")
        if not RESERVED_FIELDS.isdisjoint(fields):
            clash = RESERVED_FIELDS.intersection(fields)
            raise ValueError(f"field names {sorted(clash)} are filled in by the writer")
        return self._write_record(kind, fields, checked=False)

    def write_value(
        self, kind: str, step: int, peer: int, digest: str, nbytes: int, value=None
    ) -> int:
        """Append a value record, as :meth:`write_record` of ``kind`` and ``{"step", "peer",
        "digest", "nbytes"}`` (and ``"value"`` unless ``value`` is None) would, byte for byte:
        what a step engine's :class:`~coordinator_free.engine.events.ValueLog` (a ``send`` or
        ``recv`` at every step) becomes, without a dict. Return its seq."""
        if kind not in VALUE_KINDS:  # any other kind is checked the general way
            return self.write_record(kind, value_fields(step, peer, digest, nbytes, value))
        # The record of every step's send and recv, encoded directly: its fields are plain
        # numbers, a hex digest and a float64 vector, which need no name checks.
        t_mono = t_wall = None
        with self._lock:
            if self._fd is not None and not self._broken:
                seq = self._seq
                t_mono, t_wall = time.monotonic(), time.time()
                parts = _value_record_parts(
                    kind, seq, t_mono, t_wall, step, peer, digest, nbytes, value
                )
                if parts is not None:
                    held = self._held
                    if held is not None:
                        held.extend(parts)
                    else:
                        self._append_bytes(parts)
                    self._seq = seq + 1
                    return seq
        # A closed or broken log (the general way says so), or fields of another form (at
        # the times read for it).
        times = None if t_mono is None else (t_mono, t_wall)
        return self._write_record(
            kind, value_fields(step, peer, digest, nbytes, value), True, times
        )

    def _write_record(
        self, kind: str, fields: dict, checked: bool = True, times: tuple | None = None
    ) -> int:
        """Append a record of ``kind`` with ``fields`` (at ``times``, ``(t_mono, t_wall)``,
        else now)."""
        with self._lock:
            if self._fd is None:
                raise ValueError(f"view log {self.path} is closed")
            if self._broken:
                raise ViewLogError(f"view log {self.path} is unusable: {self._broken}")
            seq = self._seq
            t_mono, t_wall = times if times is not None else (time.monotonic(), time.time())
            if len(fields) < 6:
                parts = _value_parts(kind, seq, t_mono, t_wall, fields)
            else:
                parts = None
            if parts is None:
                if not checked:
                    check_fields(fields, kind)
                record = {"k": kind, "seq": seq, "t_mono": t_mono, "t_wall": t_wall, **fields}
                parts = _encode_parts(record)
            if self._held is not None:
                self._held.extend(parts)
            else:
                self._append_bytes(parts)
            self._seq = seq + 1
            return seq

    def hold(self) -> None:
        """Keep the records written from now on until :meth:`flush`, which hands them to the
        operating system together, in one vectored write (a step's records: one system call).
        Their ``seq`` and times are those of the moment each was written. The caller flushes
        before it waits on anything (the network, a timer), so a crash loses no more than the
        records made since the last flush, a few microseconds of work; a torn tail is cut by
        the reader as before (every record keeps its own frame and checksum)."""
        with self._lock:
            if self._held is None:
                self._held = []

    def flush(self) -> None:
        """Write the held records (one vectored write) and stop holding. Idempotent."""
        with self._lock:
            held, self._held = self._held, None
            if held and self._fd is not None:
                self._append_bytes(held)

    def _append_bytes(self, data: bytes | list) -> None:
        """Write ``data`` (bytes, or pieces written back to back) at the end; on failure cut
        the file back so no torn record remains."""
        assert self._fd is not None
        start = self._size
        # Pieces are bytes or flat byte views (len() is their size in bytes).
        pieces = [data] if isinstance(data, bytes) else data
        total = sum(map(len, pieces))
        try:
            # One vectored write takes it all in the common case; the rest is written on.
            written = os.writev(self._fd, pieces if len(pieces) <= _IOV_MAX else pieces[:_IOV_MAX])
            if written != total:
                self._write_rest(pieces, written)
        except BaseException as exc:
            try:
                os.ftruncate(self._fd, start)
            except OSError as trunc_exc:
                self._broken = (
                    f"a write failed ({exc}) and the partial record could not be removed "
                    f"({trunc_exc})"
                )
            raise
        self._size = start + total
        if self._size - self._advised >= DROP_BEHIND + _DROP_STEP:
            self._drop_behind()

    def _write_rest(self, pieces: list, written: int) -> None:
        """Write ``pieces`` on after a vectored write that took only its first ``written``
        bytes (a partial piece keeps its rest), at most :data:`_IOV_MAX` pieces a write."""
        i = 0
        while True:
            while written:  # skip what was written
                n = len(pieces[i])
                if written >= n:
                    written -= n
                    i += 1
                else:
                    pieces[i] = memoryview(pieces[i])[written:]
                    written = 0
            while i < len(pieces) and not len(pieces[i]):
                i += 1
            if i >= len(pieces):
                return
            written = os.writev(self._fd, pieces[i : i + _IOV_MAX])

    def _drop_behind(self) -> None:
        """Advise the kernel that the pages more than :data:`DROP_BEHIND` behind the end will
        not be read by this writer: the first advice on a page starts its write-back, a later
        one (each range is advised up to three times) drops it once clean. What is in the file
        does not change; the advice only keeps a log that grows fast (every received value of
        1 MiB) from filling the page cache, whose fresh pages cost more than reused ones."""
        end = self._size - DROP_BEHIND
        lo = max(0, self._advised - 2 * _DROP_STEP)
        try:
            os.posix_fadvise(self._fd, lo, end - lo, os.POSIX_FADV_DONTNEED)
        except (AttributeError, OSError):  # advice only: without it the pages stay cached
            pass
        self._advised = end

    def sync(self) -> None:
        """Force everything written so far to stable storage."""
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)

    def close(self) -> None:
        """Write the held records, close the file (idempotent); with ``fsync=True`` sync it
        first."""
        self.flush()
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is None:
                return
            try:
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def __enter__(self) -> ViewLogWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"next seq {self._seq}"
        return f"<ViewLogWriter {self.path} run {self.run_id} node {self.node} {state}>"


#: Up to this many bytes :func:`value_digest` hashes a copy of a value's memory (8 floats: 1.5
#: against 2.2 us through a byte view); larger values are hashed as they lie.
_DIGEST_COPY_BELOW = 4096
#: The prefix of a value digest in the current form (:func:`value_digest`).
DIGEST_PREFIX = "blake3:"


def value_digest(value) -> str:
    """The digest a view log records for a vector (send, recv, token records):
    ``"blake3:"`` and the first 128 bits of BLAKE3 over its bytes, in hex. The sender and the
    receiver of a value compute it alike, so the auditor can match what was sent with what was
    received. (BLAKE3 runs at about 2.6 times SHA-256's speed here on a 1 MiB value: a 1 MiB
    gossip step digests three of them; docs/benchmarks.md.)"""
    if type(value) is np.ndarray and value.flags.c_contiguous and value.size:
        if value.nbytes <= _DIGEST_COPY_BELOW:  # a small copy costs less than a byte view
            return DIGEST_PREFIX + blake3(value.tobytes()).hexdigest(16)
        return DIGEST_PREFIX + blake3(memoryview(value).cast("B")).hexdigest(16)  # as it lies
    return DIGEST_PREFIX + blake3(raw_bytes(np.ascontiguousarray(value))).hexdigest(16)


def sha256_digest(value) -> str:
    """The digest logs written before BLAKE3 carry (no prefix): the first 128 bits of SHA-256
    over the vector's bytes, in hex."""
    return hashlib.sha256(raw_bytes(np.ascontiguousarray(value))).hexdigest()[:32]


def digest_like(value, logged: str) -> str:
    """The digest of ``value`` in the form of the digest ``logged`` (a record's): what to compare
    it with, for a log of either form."""
    if logged.startswith(DIGEST_PREFIX):
        return value_digest(value)
    return sha256_digest(value)


def both_digests(value) -> tuple[str, str]:
    """A logged value's digest in both forms (current first), for a record that holds the value
    but no digest: the log it is checked against may name the value in either form."""
    return value_digest(value), sha256_digest(value)


def same_digest(a: str | tuple[str, ...], b: str | tuple[str, ...]) -> bool:
    """Whether two digests name the same value: each a logged digest, or the forms of one
    recomputed from a logged value (:func:`both_digests`)."""
    forms_a = (a,) if type(a) is str else a
    forms_b = (b,) if type(b) is str else b
    return any(x in forms_b for x in forms_a)
