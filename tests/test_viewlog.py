"""View log: round trips, secrecy guard, and recovery from every kind of damage."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from coordinator_free import viewlog
from coordinator_free.codec import pack
from coordinator_free.viewlog import (
    FORBIDDEN_FIELDS,
    FRAME,
    MAGIC,
    LogProblem,
    ViewLogError,
    ViewLogWriter,
    iter_records,
    read_viewlog,
)

REPO = Path(__file__).resolve().parents[1]
PARAMS = {"n": 4, "sigma": 0.5, "graph": {"kind": "ring", "degree": 2}, "steps": [1, 2, 3]}


def same(a, b) -> bool:
    """Deep equality that understands numpy arrays (dtype and shape included)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and np.array_equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def write_small_log(path: Path) -> list[dict]:
    """A log with a header and three varied records; returns the fields written."""
    written = [
        {"peer": 1, "step": 0, "value": np.arange(5, dtype=np.float64)},
        {"peer": 2, "digest": b"\x00\xff" * 8, "info": {"ok": True, "sizes": [1, 2]}},
        {"peer": 3, "m": np.ones((2, 3), dtype=np.int32), "note": "late", "none": None},
    ]
    with ViewLogWriter(path, run_id="r1", node=0, params=PARAMS) as w:
        for i, fields in enumerate(written):
            w.write(f"kind{i}", **fields)
    return written


def record_boundaries(data: bytes) -> list[int]:
    """Byte offsets where each record starts, plus the end of the file."""
    offsets, pos = [], len(MAGIC)
    while pos < len(data):
        offsets.append(pos)
        length, _ = FRAME.unpack(data[pos : pos + FRAME.size])
        pos += FRAME.size + length
    assert pos == len(data)
    return offsets + [pos]


# --- round trip ---------------------------------------------------------------------------


def test_round_trip_arrays_bytes_and_nested(tmp_path):
    path = tmp_path / "n0.vlog"
    written = write_small_log(path)
    log = read_viewlog(path)
    assert log.intact, log.problems
    assert log.path == path
    assert [r["k"] for r in log.records] == ["kind0", "kind1", "kind2"]
    assert [r["seq"] for r in log.records] == [0, 1, 2]
    for rec, fields in zip(log.records, written, strict=True):
        assert same({k: rec[k] for k in fields}, fields)
        assert set(rec) == set(fields) | {"k", "seq", "t_mono", "t_wall"}
    monos = [r["t_mono"] for r in log.records]
    assert monos == sorted(monos)
    assert all(abs(r["t_wall"] - time.time()) < 60 for r in log.records)
    assert log.valid_end == log.size == path.stat().st_size
    assert log.offsets[0] > len(MAGIC)
    assert log.of_kind("kind1") == [log.records[1]]


def test_header_content(tmp_path):
    path = tmp_path / "n3.vlog"
    with ViewLogWriter(path, run_id="abc123", node=3, params=PARAMS):
        pass
    log = read_viewlog(path)
    assert log.intact
    assert log.records == []
    h = log.header
    assert h["k"] == "header"
    assert h["format"] == "cfree-viewlog"
    assert h["version"] == 1
    assert h["run_id"] == "abc123"
    assert h["node"] == 3
    assert h["params"] == PARAMS
    assert path.read_bytes().startswith(MAGIC)


def test_field_named_kind_is_allowed(tmp_path):
    with ViewLogWriter(tmp_path / "l", run_id="r", node=0, params={}) as w:
        assert w.write("bad-message", kind="too-far-ahead", peer=1) == 0
    assert read_viewlog(tmp_path / "l").records[0]["kind"] == "too-far-ahead"


def test_each_record_reaches_the_os_before_close(tmp_path):
    path = tmp_path / "live.vlog"
    w = ViewLogWriter(path, run_id="r", node=0, params={})
    try:
        for i in range(3):
            w.write("tick", i=i)
            log = read_viewlog(path)
            assert log.intact
            assert [r["i"] for r in log.records] == list(range(i + 1))
    finally:
        w.close()


def test_arrays_are_written_from_their_memory_as_the_codec_packs_them(monkeypatch):
    value = np.arange(40000, dtype=np.float64)
    record = {"k": "recv", "seq": 3, "digest": "ab", "value": value, "nbytes": value.nbytes}
    parts = viewlog._encode_parts(record)
    # The array's data is one piece, a view on the array itself (no copy of it).
    views = [p for p in parts if isinstance(p, memoryview) and p.nbytes == value.nbytes]
    assert len(views) == 1 and np.shares_memory(np.frombuffer(views[0]), value)
    moved = {k: v for k, v in record.items() if k != "value"} | {"value": value}
    payload = pack(moved)
    joined = b"".join(parts)
    assert joined == FRAME.pack(len(payload), zlib.crc32(payload)) + payload
    # Every array layout the codec knows comes out as the codec writes it (small arrays are
    # packed with the record; here every array goes by view).
    monkeypatch.setattr(viewlog, "_BY_VIEW", 0)
    for arr in (
        np.zeros(0),
        np.ones(1, dtype=np.uint8),
        np.ones(2, dtype=np.float64),
        np.ones((3, 5), dtype=np.int32),
        np.arange(6, dtype=">f8").reshape(2, 3).T,
        np.array(2.5),
        np.ones(70000, dtype=np.uint8),
    ):
        rec = {"k": "x", "a": arr, "b": [1, 2]}
        ref = pack({"k": "x", "b": [1, 2], "a": arr})
        assert viewlog._encode(rec)[FRAME.size :] == ref, arr.shape


def test_value_records_are_encoded_directly_as_the_general_encoder_does(tmp_path, monkeypatch):
    """The step engine's send and recv records (step, peer, digest, nbytes and, logged, the
    value) skip the general encoder: the same bytes, for every integer width, digest length,
    vector length (packed with the record or written from its memory) and kind; any other
    form of record goes the general way."""
    rng = np.random.default_rng(5)
    ints = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]
    count = 0
    for kind in ("send", "recv", "x" * 31, "y" * 40):
        for i, step in enumerate(ints):
            for size in (None, 1, 8, 511, 512, 513, 1000):
                peer, nbytes = ints[(i + 3) % len(ints)], ints[(i + 5) % len(ints)]
                digest = "ab" * (16, 5, 100)[(i + (size or 0)) % 3]
                fields = {"step": step, "peer": peer, "digest": digest, "nbytes": nbytes}
                if size is not None:
                    fields["value"] = rng.standard_normal(size)
                t_mono, t_wall = float(rng.random() * 1e6), float(rng.random() * 2e9)
                seq = ints[(i + 7 + (size or 0)) % len(ints)]  # its width apart from the step's
                fast = viewlog._value_parts(kind, seq, t_mono, t_wall, fields)
                record = {"k": kind, "seq": seq, "t_mono": t_mono, "t_wall": t_wall, **fields}
                slow = viewlog._encode_parts(record)
                assert fast is not None
                assert b"".join(map(bytes, fast)) == b"".join(map(bytes, slow)), record["k"]
                if size is not None and size * 8 >= viewlog._BY_VIEW:  # no copy of the value
                    assert np.shares_memory(np.frombuffer(fast[-1]), fields["value"])
                count += 1
    assert count == 4 * len(ints) * 7
    value = np.ones(4)
    others = [
        {"step": 1, "peer": 2, "digest": "ab", "nbytes": 32, "now": 3, "value": value},
        {"peer": 2, "step": 1, "digest": "ab", "nbytes": 32},
        {"step": -1, "peer": 2, "digest": "ab", "nbytes": 32},
        {"step": True, "peer": 2, "digest": "ab", "nbytes": 32},
        {"step": 1, "peer": True, "digest": "ab", "nbytes": 32},
        {"step": 1, "peer": 2, "digest": "ab", "nbytes": False},
        {"step": 1, "peer": -2, "digest": "ab", "nbytes": 32},
        {"step": 1, "peer": 2.0, "digest": "ab", "nbytes": 32},
        {"step": 1, "peer": 2, "digest": b"ab", "nbytes": 32},
        {"step": 1, "peer": 2, "digest": "é", "nbytes": 32},
        {"step": 1, "peer": 2, "digest": "ab", "nbytes": 2**64},
        {"step": 1, "peer": 2, "digest": "ab", "nbytes": 32, "value": value.astype("<f4")},
        {"step": 1, "peer": 2, "digest": "ab", "nbytes": 32, "value": np.ones((2, 2))},
        {"step": 1, "peer": 2, "digest": "ab", "nbytes": 32, "value": np.ones(8)[::2]},
        {"step": 1, "peer": 2, "digest": "ab", "nbytes": 32, "value": np.zeros(0)},
        {"step": 1, "peer": 2, "digest": "ab", "nbytes": 32, "value": [1.0]},
        {"step": 2**64, "peer": 2, "digest": "ab", "nbytes": 32},
        {"step": 1.0, "peer": 2, "digest": "ab", "nbytes": 32},
    ]
    for fields in others:
        assert viewlog._value_parts("recv", 0, 1.0, 2.0, fields) is None, fields
    # The fixed bytes kept for a form are those of that form only: a record after others of
    # other peers, sizes and kinds is still the general encoder's.
    for kind, peer, size in (("recv", 1, 4), ("send", 1, 4), ("recv", 2, 4), ("recv", 1, 5)):
        fields = {"step": 9, "peer": peer, "digest": "cd" * 16, "nbytes": 8 * size}
        fields["value"] = np.arange(float(size))
        fast = viewlog._value_parts(kind, 300, 1.5, 2.5, fields)
        slow = viewlog._encode_parts(
            {"k": kind, "seq": 300, "t_mono": 1.5, "t_wall": 2.5, **fields}
        )
        assert b"".join(map(bytes, fast)) == b"".join(map(bytes, slow)), (kind, peer, size)
    # Written through the writer, both kinds read back as written; an oversized value record
    # is refused like any other, and nothing is written.
    path = tmp_path / "l"
    with ViewLogWriter(path, run_id="r", node=0, params={}) as w:
        for fields in (others[1], others[2], others[4], others[8]):
            w.write("recv", **fields)
        w.write("recv", step=3, peer=1, digest="cd" * 16, nbytes=8000, value=np.arange(1000.0))
        monkeypatch.setattr(viewlog, "MAX_RECORD_BYTES", 1000)
        size = path.stat().st_size
        with pytest.raises(ValueError, match="over the limit"):
            w.write("recv", step=4, peer=1, digest="cd" * 16, nbytes=8000, value=np.ones(1000))
        assert path.stat().st_size == size
    monkeypatch.undo()
    log = read_viewlog(path)
    assert log.intact and [r["step"] for r in log.records if r["k"] == "recv"] == [1, -1, 1, 1, 3]
    assert np.array_equal(log.records[-1]["value"], np.arange(1000.0))


def test_value_records_written_field_by_field_are_those_of_the_dict(tmp_path, monkeypatch):
    """``write_value`` (a step engine's ``ValueLog``, no dict) writes the bytes ``write_record``
    writes of the same fields, for send and recv, with and without the value, and for fields
    the direct encoding declines (which then go the general way); another kind goes through
    ``write_record``'s checks; an ``ValueLog`` reads as the ``Log`` of its dict."""
    import copy
    import pickle

    from coordinator_free.engine.events import Log, ValueLog

    clock = iter(range(1, 10_000))
    monkeypatch.setattr(viewlog.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(viewlog.time, "time", lambda: 1.7e9)
    value = np.arange(8.0)
    cases = [
        ("send", 3, 1, "ab" * 16, 64, None),
        ("recv", 3, 15, "cd" * 16, 64, value),
        ("recv", 300, 2, "ef" * 16, 64, None),
        ("recv", 4, True, "ab", 64, value),  # a bool peer: the general way
        ("send", 4, 1, "ab", 64, value[::2]),  # not contiguous: the general way
        ("late", 2, 1, "ab", 64, value),  # another kind: write_record
    ]
    paths = {}
    for how in ("dict", "fields"):
        path = paths[how] = tmp_path / how
        with ViewLogWriter(path, run_id="r", node=0, params={}) as w:
            for kind, step, peer, digest, nbytes, v in cases:
                log = ValueLog(kind, step, peer, digest, nbytes, v)
                if how == "dict":
                    w.write_record(kind, log.fields)
                else:
                    w.write_value(kind, step, peer, digest, nbytes, v)
                assert log == Log(kind, log.fields) and Log(kind, log.fields) == log
                for copied in (copy.deepcopy(log), pickle.loads(pickle.dumps(log))):
                    assert type(copied) is ValueLog and copied.fields.keys() == log.fields.keys()
                    assert repr(copied) == repr(log)
                assert ("value" in log.fields) == (v is not None)
            with pytest.raises(ValueError, match="reserved"):
                w.write_value("header", 1, 1, "ab", 8)
            with pytest.raises(ValueError, match="cannot encode"):
                w.write_value("recv", 1, 1, "ab", 8, object())
        clock = iter(range(1, 10_000))  # the second log's records get the first's times
    assert paths["dict"].read_bytes() == paths["fields"].read_bytes()
    records = read_viewlog(paths["fields"]).records
    assert [r["k"] for r in records] == [c[0] for c in cases]
    assert "value" not in records[0] and np.array_equal(records[1]["value"], value)


def test_held_records_go_out_together_at_flush_in_order(tmp_path):
    path = tmp_path / "held.vlog"
    with ViewLogWriter(path, run_id="r", node=0, params={}) as w:
        w.write("before")
        size = path.stat().st_size
        w.hold()
        for i in range(3):
            assert w.write("held", i=i, value=np.full(3, float(i))) == i + 1
        assert path.stat().st_size == size  # nothing handed over yet
        w.flush()
        w.flush()  # idempotent
        w.write("after")
        assert [r["k"] for r in read_viewlog(path).records] == [
            "before", "held", "held", "held", "after"
        ]  # fmt: skip
        w.hold()
        w.write("kept until close")
    log = read_viewlog(path)
    assert log.intact, log.problems
    assert [r["seq"] for r in log.records] == list(range(6))
    assert log.records[-1]["k"] == "kept until close"
    assert np.array_equal(log.records[2]["value"], np.full(3, 1.0))


@pytest.mark.parametrize("most", [1, 7, 100, 5000])
def test_short_vectored_writes_are_written_on_without_losing_or_repeating_a_byte(
    tmp_path, monkeypatch, most
):
    """A vectored write may take fewer bytes than it was given (the operating system's
    choice), and one write takes at most _IOV_MAX pieces: the writer writes on from the byte
    where the last write stopped, so held records of many pieces (values logged from their own
    memory among them) reach the file whole and once each."""
    real = os.writev
    calls = []

    def short(fd, pieces):
        pieces = list(pieces)
        assert len(pieces) <= 3  # never more than _IOV_MAX pieces a write
        calls.append(len(pieces))
        return real(fd, [b"".join(bytes(p) for p in pieces)[:most]])

    monkeypatch.setattr(viewlog, "_IOV_MAX", 3)
    path = tmp_path / "short.vlog"
    with ViewLogWriter(path, run_id="r", node=0, params={}) as w:
        monkeypatch.setattr(viewlog.os, "writev", short)
        w.hold()
        values = [np.full(n, float(n)) for n in (8, 600, 1, 4096)]
        for i, v in enumerate(values):
            w.write_record(
                "recv", {"step": i, "peer": 1, "digest": "d", "nbytes": v.nbytes, "value": v}
            )
            w.write("note", i=i)
        w.flush()
        monkeypatch.setattr(viewlog.os, "writev", real)
    assert len(calls) > 2
    log = read_viewlog(path)
    assert log.intact, log.problems
    assert [r["k"] for r in log.records] == ["recv", "note"] * len(values)
    got = [r["value"] for r in log.records if r["k"] == "recv"]
    assert all(np.array_equal(a, b) for a, b in zip(got, values, strict=True))


def test_a_fast_growing_log_advises_its_old_pages_out_and_keeps_every_byte(tmp_path, monkeypatch):
    """Pages more than DROP_BEHIND behind the end are advised out of the page cache, each range
    up to three times (write-back first, then the drop) and never the last DROP_BEHIND bytes;
    the file holds every record either way."""
    calls: list[tuple[int, int]] = []
    real = os.posix_fadvise

    def spy(fd, offset, length, advice):
        assert advice == os.POSIX_FADV_DONTNEED
        calls.append((offset, length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(viewlog.os, "posix_fadvise", spy)
    path = tmp_path / "big.vlog"
    values = [np.full(1 << 17, float(i)) for i in range(40)]  # 1 MiB each
    with ViewLogWriter(path, run_id="r", node=0, params={}) as w:
        for i, v in enumerate(values):
            w.write("recv", step=i, value=v)
            size = path.stat().st_size
            if calls:  # never the last DROP_BEHIND bytes
                lo, length = calls[-1]
                assert lo + length <= size - viewlog.DROP_BEHIND
    assert len(calls) >= 3
    ends = [lo + length for lo, length in calls]
    assert ends == sorted(ends) and calls[0][0] == 0
    for (lo, _), prev_end in zip(calls[1:], ends, strict=False):
        assert lo < prev_end  # each range again with the next: dropped once written back
    log = read_viewlog(path)
    assert log.intact, log.problems
    assert all(np.array_equal(r["value"], v) for r, v in zip(log.records, values, strict=True))


def test_a_slow_log_is_never_advised(tmp_path, monkeypatch):
    monkeypatch.setattr(viewlog.os, "posix_fadvise", lambda *a: pytest.fail("advised"))
    with ViewLogWriter(tmp_path / "small.vlog", run_id="r", node=0, params={}) as w:
        for i in range(2000):
            w.write("recv", step=i, value=np.full(8, float(i)))


def test_close_is_idempotent_and_write_after_close_fails(tmp_path):
    w = ViewLogWriter(tmp_path / "l", run_id="r", node=0, params={}, fsync=True)
    w.write("a")
    w.close()
    w.close()
    assert w.closed
    with pytest.raises(ValueError, match="closed"):
        w.write("b")


# --- the secrecy guard --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FORBIDDEN_FIELDS))
def test_forbidden_field_refused(tmp_path, name):
    path = tmp_path / "l"
    with ViewLogWriter(path, run_id="r", node=0, params={}) as w:
        with pytest.raises(ValueError, match="secret"):
            w.write("x", **{name: b"\x01" * 32})
        with pytest.raises(ValueError, match="secret"):
            w.write("x", **{name.upper(): 1})
        assert w.next_seq == 0
    assert read_viewlog(path).records == []


def test_forbidden_field_refused_when_nested(tmp_path):
    path = tmp_path / "l"
    with ViewLogWriter(path, run_id="r", node=0, params={}) as w:
        with pytest.raises(ValueError, match=r"x\.info\.deep\[1\]\.seed_secret"):
            w.write("x", info={"deep": [{"fine": 1}, {"seed_secret": b"s"}]})
        with pytest.raises(ValueError, match="secret"):
            w.write("x", items=({"a": {"noise": np.zeros(3)}},))
        w.write("x", public_key=b"\x00" * 32, noise_sigma=1.0)  # similar names are fine
    log = read_viewlog(path)
    assert [r["seq"] for r in log.records] == [0]


def test_forbidden_field_in_params_refused_before_creating_file(tmp_path):
    path = tmp_path / "l"
    with pytest.raises(ValueError, match="own_noise"):
        ViewLogWriter(path, run_id="r", node=0, params={"node": {"own_noise": 1.0}})
    assert not path.exists()


def test_reserved_names_non_string_keys_and_unencodable_values_refused(tmp_path):
    path = tmp_path / "l"
    with ViewLogWriter(path, run_id="r", node=0, params={}) as w:
        for bad in ("seq", "t_mono", "t_wall", "k"):
            with pytest.raises(ValueError, match="filled in by the writer"):
                w.write("x", **{bad: 1})
        with pytest.raises(ValueError, match="reserved"):
            w.write("header")
        with pytest.raises(ValueError, match="map key 3"):
            w.write("x", by_peer={3: 1.0})
        with pytest.raises(ValueError, match="cannot encode"):
            w.write("x", obj=object())
        with pytest.raises(ValueError, match="cannot encode"):
            w.write("x", arr=np.array(["a"], dtype=object))
        assert w.write("x") == 0
    log = read_viewlog(path)
    assert log.intact and len(log.records) == 1


def test_oversized_record_refused_and_nothing_written(tmp_path, monkeypatch):
    monkeypatch.setattr(viewlog, "MAX_RECORD_BYTES", 1000)
    path = tmp_path / "l"
    with ViewLogWriter(path, run_id="r", node=0, params={}) as w:
        size = path.stat().st_size
        with pytest.raises(ValueError, match="over the limit"):
            w.write("big", value=np.zeros(200))
        assert path.stat().st_size == size
        assert w.write("small", value=np.zeros(10)) == 0
    assert read_viewlog(path).intact


def test_oversized_length_on_read_is_a_bad_record(tmp_path):
    path = tmp_path / "l"
    write_small_log(path)
    data = path.read_bytes()
    cut = record_boundaries(data)[2]
    path.write_bytes(data[:cut] + FRAME.pack(viewlog.MAX_RECORD_BYTES + 1, 0) + b"x" * 64)
    log = read_viewlog(path)
    assert [r["k"] for r in log.records] == ["kind0"]
    assert [(p.kind, p.offset) for p in log.problems] == [("bad-record", cut)]
    assert "exceeds the limit" in log.problems[0].message


# --- refusing to lose data ----------------------------------------------------------------


def test_refuses_to_overwrite_a_non_empty_file(tmp_path):
    path = tmp_path / "l"
    path.write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        ViewLogWriter(path, run_id="r", node=0, params={})
    assert path.read_bytes() == b"precious"
    write_small_log(tmp_path / "m")
    before = (tmp_path / "m").read_bytes()
    with pytest.raises(FileExistsError):
        ViewLogWriter(tmp_path / "m", run_id="r1", node=0, params={})
    assert (tmp_path / "m").read_bytes() == before


def test_an_existing_empty_file_is_used(tmp_path):
    path = tmp_path / "l"
    path.touch()
    with ViewLogWriter(path, run_id="r", node=0, params={}) as w:
        w.write("a")
    assert read_viewlog(path).intact


def test_second_writer_on_the_same_file_is_refused(tmp_path):
    path = tmp_path / "l"
    with ViewLogWriter(path, run_id="r", node=0, params={}) as w:
        with pytest.raises(ViewLogError, match="another process"):
            ViewLogWriter(path, run_id="r", node=0, params={}, append=True)
        w.write("a")
    assert read_viewlog(path).intact


def test_append_continues_the_sequence(tmp_path):
    path = tmp_path / "l"
    write_small_log(path)
    with ViewLogWriter(path, run_id="r1", node=0, params=PARAMS, append=True) as w:
        assert w.write("after") == 4
    log = read_viewlog(path)
    assert log.intact, log.problems
    assert [r["k"] for r in log.records] == ["kind0", "kind1", "kind2", "resume", "after"]
    assert log.records[3]["dropped_tail_bytes"] == 0
    assert log.records[3]["params"] == PARAMS


def test_append_cuts_a_torn_tail_and_says_so(tmp_path):
    path = tmp_path / "l"
    write_small_log(path)
    data = path.read_bytes()
    path.write_bytes(data[:-5])
    last_start = record_boundaries(data)[-2]
    with ViewLogWriter(path, run_id="r1", node=0, params=PARAMS, append=True) as w:
        w.write("after")
    log = read_viewlog(path)
    assert log.intact, log.problems
    assert [r["k"] for r in log.records] == ["kind0", "kind1", "resume", "after"]
    assert log.records[2]["dropped_tail_bytes"] == len(data) - 5 - last_start
    assert [r["seq"] for r in log.records] == [0, 1, 2, 3]


def test_append_to_a_missing_or_empty_file_starts_a_new_log(tmp_path):
    for path in (tmp_path / "missing", tmp_path / "torn-magic"):
        if path.name == "torn-magic":
            path.write_bytes(MAGIC[:3])
        with ViewLogWriter(path, run_id="r", node=2, params={}, append=True) as w:
            w.write("a")
        log = read_viewlog(path)
        assert log.intact and log.header["node"] == 2
        assert [r["k"] for r in log.records] == ["a"]


def test_append_refuses_other_runs_and_damaged_files(tmp_path):
    path = tmp_path / "l"
    write_small_log(path)
    before = path.read_bytes()
    with pytest.raises(ViewLogError, match="belongs to run 'r1' node 0"):
        ViewLogWriter(path, run_id="other", node=0, params={}, append=True)
    with pytest.raises(ViewLogError, match="belongs to run"):
        ViewLogWriter(path, run_id="r1", node=1, params={}, append=True)
    damaged = bytearray(before)
    damaged[record_boundaries(before)[2] + FRAME.size + 2] ^= 0x40
    path.write_bytes(bytes(damaged))
    with pytest.raises(ViewLogError, match="bad-checksum.*left as it is"):
        ViewLogWriter(path, run_id="r1", node=0, params={}, append=True)
    assert path.read_bytes() == bytes(damaged)
    garbage = tmp_path / "g"
    garbage.write_bytes(b"hello world, not a log")
    with pytest.raises(ViewLogError, match="bad-magic"):
        ViewLogWriter(garbage, run_id="r1", node=0, params={}, append=True)
    assert garbage.read_bytes() == b"hello world, not a log"


# --- damage -------------------------------------------------------------------------------


def test_truncation_at_every_offset(tmp_path):
    full_path = tmp_path / "full"
    write_small_log(full_path)
    data = full_path.read_bytes()
    full = read_viewlog(full_path)
    bounds = record_boundaries(data)  # header start, record starts..., end
    header_end = bounds[1]
    cut_path = tmp_path / "cut"
    for cut in range(len(data) + 1):
        cut_path.write_bytes(data[:cut])
        log = read_viewlog(cut_path)  # must never raise
        complete = sum(1 for start, end in zip(bounds, bounds[1:], strict=False) if end <= cut) - 1
        assert len(log.records) == max(complete, 0), cut
        for got, want in zip(log.records, full.records, strict=False):
            assert same(got, want), cut
        kinds = [p.kind for p in log.problems]
        if cut >= header_end:
            assert same(log.header, full.header), cut
            if cut in bounds:
                assert log.intact, (cut, log.problems)
            else:
                assert kinds == ["torn-tail"], (cut, log.problems)
                start = max(b for b in bounds if b <= cut)
                assert log.problems[0].offset == start
                assert f"{cut - start} of" in log.problems[0].message
                assert log.valid_end == start
        else:
            assert log.header is None
            assert set(kinds) <= {"torn-tail", "missing-header"} and "missing-header" in kinds
            assert ("torn-tail" in kinds) == (cut not in (0, len(MAGIC))), (cut, kinds)


def test_every_single_byte_flip_is_detected_and_earlier_records_survive(tmp_path):
    path = tmp_path / "full"
    write_small_log(path)
    data = path.read_bytes()
    full = read_viewlog(path)
    bounds = record_boundaries(data)
    flipped = tmp_path / "flipped"
    for pos in range(len(data)):
        bad = bytearray(data)
        bad[pos] ^= 0x01
        flipped.write_bytes(bytes(bad))
        log = read_viewlog(flipped)
        assert not log.intact, pos
        if pos < len(MAGIC):
            assert [p.kind for p in log.problems] == ["bad-magic"]
            continue
        hit = max(i for i, b in enumerate(bounds[:-1]) if b <= pos)  # 0 = header
        assert all(p.offset >= bounds[hit] for p in log.problems), pos
        survivors = hit - 1 if hit else 0
        assert len(log.records) >= survivors
        for got, want in zip(log.records[:survivors], full.records[:survivors], strict=True):
            assert same(got, want)


def test_flipped_payload_byte_is_a_bad_checksum_at_that_record(tmp_path):
    path = tmp_path / "l"
    write_small_log(path)
    data = bytearray(path.read_bytes())
    bounds = record_boundaries(bytes(data))
    target = bounds[2]  # the second ordinary record
    data[target + FRAME.size + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    log = read_viewlog(path)
    assert [r["k"] for r in log.records] == ["kind0"]
    assert len(log.problems) == 1
    p = log.problems[0]
    assert (p.kind, p.offset) == ("bad-checksum", target)
    assert f"offset {target}" in str(p)
    assert log.valid_end == target


def test_garbage_file_is_bad_magic(tmp_path):
    for content in (b"\x00" * 100, b"GIF89a" + os.urandom(50), b"CFVLOG9\n" + b"\x00" * 8):
        path = tmp_path / "g"
        path.write_bytes(content)
        log = read_viewlog(path)
        assert [p.kind for p in log.problems] == ["bad-magic"]
        assert log.header is None and log.records == []


def test_missing_file_raises_with_the_path(tmp_path):
    path = tmp_path / "nope.vlog"
    with pytest.raises(FileNotFoundError, match="nope.vlog"):
        read_viewlog(path)


def frame(obj) -> bytes:
    payload = obj if isinstance(obj, bytes) else pack(obj)
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def header(**over):
    h = {"k": "header", "format": "cfree-viewlog", "version": 1, "run_id": "r", "node": 0}
    h["params"] = {}
    h.update(over)
    return h


def test_seq_gaps_and_duplicates_are_reported(tmp_path):
    path = tmp_path / "l"
    recs = [{"k": "a", "seq": s} for s in (0, 1, 4, 4, 5, 2)]
    path.write_bytes(MAGIC + frame(header()) + b"".join(frame(r) for r in recs))
    log = read_viewlog(path)
    assert [r["seq"] for r in log.records] == [0, 1, 4, 4, 5, 2]
    got = [(p.kind, log.offsets.index(p.offset)) for p in log.problems]
    assert got == [("seq-gap", 2), ("seq-duplicate", 3), ("seq-duplicate", 5)]
    assert "seqs 2..3 missing" in log.problems[0].message


def test_decodable_but_wrong_records_are_skipped_with_a_problem(tmp_path):
    path = tmp_path / "l"
    body = [
        frame(header()),
        frame({"k": "a", "seq": 0}),
        frame(b"\xc1"),  # valid frame, undecodable payload
        frame([1, 2, 3]),  # decodes, but not a record
        frame({"k": "b", "seq": 1}),
        frame({"k": "c"}),  # no seq
    ]
    path.write_bytes(MAGIC + b"".join(body))
    log = read_viewlog(path)
    assert [r["k"] for r in log.records] == ["a", "b", "c"]
    assert [p.kind for p in log.problems] == ["bad-record"] * 3
    with pytest.raises(ViewLogError, match="bad-record"):
        list(iter_records(path))
    problems: list[LogProblem] = []
    assert [r["k"] for _, r in iter_records(path, problems)] == ["header", "a", "b", "c"]
    assert len(problems) == 2


def test_missing_and_bad_header(tmp_path):
    path = tmp_path / "l"
    path.write_bytes(MAGIC + frame({"k": "a", "seq": 0}))
    log = read_viewlog(path)
    assert log.header is None
    assert [p.kind for p in log.problems] == ["missing-header"]
    assert [r["k"] for r in log.records] == ["a"]
    path.write_bytes(MAGIC + frame(header(version=7)))
    log = read_viewlog(path)
    assert [p.kind for p in log.problems] == ["bad-header"]
    assert "version 7" in log.problems[0].message
    path.write_bytes(MAGIC)
    log = read_viewlog(path)
    assert [(p.kind, p.offset) for p in log.problems] == [("missing-header", len(MAGIC))]


# --- a writer that is killed --------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from coordinator_free.viewlog import ViewLogWriter

    w = ViewLogWriter(sys.argv[1], run_id="killed", node=5, params={"n": 1})
    i = 0
    while True:
        w.write("step", i=i, value=np.full(20000, float(i)))
        print(i, flush=True)
        i += 1
    """
)


def test_writer_killed_mid_run_leaves_every_acknowledged_record(tmp_path):
    path = tmp_path / "killed.vlog"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, env=env
    )
    acknowledged = -1
    buf = b""
    deadline = time.monotonic() + 30
    try:
        while acknowledged < 20:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "child did not write records in time"
            ready, _, _ = select.select([proc.stdout], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, f"child exited early with {proc.wait()}"
            buf += chunk
            *lines, buf = buf.split(b"\n")
            if lines:
                acknowledged = int(lines[-1])
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    log = read_viewlog(path)
    assert log.header["run_id"] == "killed" and log.header["node"] == 5
    assert {p.kind for p in log.problems} <= {"torn-tail"}
    assert len(log.records) >= acknowledged + 1
    for i, rec in enumerate(log.records):
        assert rec["seq"] == i and rec["i"] == i
        assert np.array_equal(rec["value"], np.full(20000, float(i)))
    # The damaged log can be resumed without losing any complete record.
    n = len(log.records)
    with ViewLogWriter(path, run_id="killed", node=5, params={"n": 1}, append=True) as w:
        w.write("after-restart")
    resumed = read_viewlog(path)
    assert resumed.intact
    assert [r["k"] for r in resumed.records[n:]] == ["resume", "after-restart"]


def test_the_record_checksum_is_zlibs_crc32_computed_faster():
    """Records are checksummed with ISA-L's CRC-32, which must be zlib's bit for bit (the
    format says zlib.crc32): whole, chained over pieces, from memoryviews and numpy buffers,
    empty; and the fast one is the one in use (isal is a dependency)."""
    from coordinator_free import viewlog

    assert viewlog.crc32 is not zlib.crc32
    rng = np.random.default_rng(32)
    for size in [0, 1, 7, 64, 4095, 4096, 65537, 1 << 20]:
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert viewlog.crc32(data) == zlib.crc32(data)
        cut = size // 3
        chained = viewlog.crc32(memoryview(data)[cut:], viewlog.crc32(data[:cut]))
        assert chained == zlib.crc32(data)
        arr = np.frombuffer(data, dtype=np.uint8)
        assert viewlog.crc32(arr, 12345) == zlib.crc32(arr, 12345)


@pytest.mark.parametrize("size", [40, 512, 513, 2000])
def test_value_digests_name_the_bytes_of_a_vector_in_either_form(size):
    """A value's digest is BLAKE3 over its bytes, prefixed; logs written before carry the first
    128 bits of SHA-256; a digest recomputed to check a logged one takes the logged one's form,
    whatever the array's memory layout and on both sides of the size up to which the bytes are
    hashed from a copy (4 KiB: 512 floats)."""
    import hashlib

    from blake3 import blake3

    v = np.random.default_rng(3).random(size)
    raw = v.tobytes()
    new = viewlog.value_digest(v)
    assert new == "blake3:" + blake3(raw).hexdigest()[:32]
    old = hashlib.sha256(raw).hexdigest()[:32]
    assert viewlog.sha256_digest(v) == old
    frozen = np.frombuffer(raw, dtype=np.float64)  # read-only, as a received value lies
    strided = np.repeat(v, 2)[::2]  # not contiguous
    for same in (v, frozen, strided, v.tolist()):
        assert viewlog.value_digest(same) == new
        assert viewlog.digest_like(same, new) == new
        assert viewlog.digest_like(same, old) == old
    assert viewlog.value_digest(np.zeros(0)) == "blake3:" + blake3(b"").hexdigest()[:32]
    assert viewlog.value_digest(v[1:]) != new and viewlog.digest_like(v[1:], old) != old
