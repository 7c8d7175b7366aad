"""A fuzzer of view logs for the auditor, family-agnostic: it takes a run directory, damages or
forges one node's log at a time and checks what ``audit_run`` makes of it.

The rule every case must keep: the audit returns (no traceback), reports every (observer,
source, method) of the run, and never silently accepts a changed loss: either every entry
equals the unmutated audit's, or the report has integrity findings and every entry is at least
the fault-free plan's.

Mutations, drawn from a seeded generator:

* bytes: flip bytes, truncate at a random offset or at a record boundary, empty the file,
  delete it, replace it with another node's log;
* frames (each re-framed with a valid checksum): delete, duplicate, insert a frame copied from
  elsewhere (this log or another node's), swap two neighbouring frames;
* records (decoded, changed, encoded and re-framed with a valid checksum): change the kind, a
  step, a peer, a digest, a value, a seq, a field's type; delete a field; add one; the header's
  node, run id, public parameters, format; delete an exchange record (``recv``, ``late``,
  ``miss``, ``send``, ``finished``) with and without renumbering the seqs after it; insert a
  copy of one with renumbered seqs.

Not generated, because no auditor can tell it from an honest run: a node rewriting its own log
so that a value it received on time appears to have come late (the ``recv`` record turned into
``late``, a matching ``miss`` record written before it, every seq renumbered). Its view is
unchanged (a late value counts as seen), but the schedule it claims to have followed is not the
one it followed; nothing in any other node's log depends on when it used the value.
"""

from __future__ import annotations

import copy
import random
import shutil
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from coordinator_free import rundir
from coordinator_free.accounting import audit
from coordinator_free.codec import CodecError, pack, unpack
from coordinator_free.families import family_of
from coordinator_free.viewlog import FRAME, MAGIC

EXCHANGE_KINDS = ("recv", "late", "miss", "send", "finished")
KINDS = (
    "recv", "late", "miss", "send", "finished", "duplicate", "peer-down", "peer-up",
    "peer-done", "bad-message", "connected", "exchange", "resume", "header", "token-seen",
)  # fmt: skip
ODD_VALUES = (
    None, True, False, -1, 0, 1, 2**40, 1.5, float("nan"), "0", "x" * 32, b"\x00", [], [1],
    {"a": 1}, np.zeros(3), np.zeros((2, 2)), np.array([True, False]),
)  # fmt: skip


# ------------------------------------------------------------------------------------ frames


@dataclass
class Log:
    """A view log split into its frames: ``magic`` and each frame's payload (the header
    first), with ``tail`` the bytes after the last whole frame."""

    magic: bytes
    payloads: list[bytes]
    tail: bytes = b""
    records: list = field(default_factory=list)  # decoded payloads (None if undecodable)

    @classmethod
    def parse(cls, raw: bytes) -> Log:
        magic, off, payloads = raw[: len(MAGIC)], len(MAGIC), []
        while off + FRAME.size <= len(raw):
            length, crc = FRAME.unpack_from(raw, off)
            end = off + FRAME.size + length
            if end > len(raw) or zlib.crc32(raw[off + FRAME.size : end]) != crc:
                break
            payloads.append(raw[off + FRAME.size : end])
            off = end
        log = cls(magic, payloads, raw[off:])
        log.records = [_decode(p) for p in payloads]
        return log

    def boundaries(self) -> list[int]:
        """The byte offsets where a frame starts or the file ends."""
        out, off = [len(self.magic)], len(self.magic)
        for p in self.payloads:
            off += FRAME.size + len(p)
            out.append(off)
        return out

    def bytes(self, payloads: list[bytes] | None = None) -> bytes:
        ps = self.payloads if payloads is None else payloads
        return self.magic + b"".join(frame(p) for p in ps) + self.tail


def frame(payload: bytes) -> bytes:
    """A frame with a valid length and checksum around ``payload``."""
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _decode(payload: bytes):
    try:
        return unpack(payload)
    except CodecError:
        return None


def encode(record) -> bytes:
    return pack(record)


# ------------------------------------------------------------------------------------- cases


@dataclass
class Case:
    node: int
    what: str
    data: bytes | None  # the node's new log (None: the log is deleted)


class Mutator:
    """Draws mutated logs of one run directory's nodes."""

    def __init__(self, run_dir: Path, seed: int):
        self.rng = random.Random(seed)
        self.run_dir = Path(run_dir)
        self.raw = {}
        for p in sorted(rundir.logs_dir(run_dir).glob("node-*.vlog")):
            self.raw[int(p.stem.split("-")[1])] = p.read_bytes()
        self.logs = {v: Log.parse(b) for v, b in self.raw.items()}
        self.nodes = sorted(self.raw)

    def case(self) -> Case:
        v = self.rng.choice(self.nodes)
        ops = [
            (self.flip, 3), (self.truncate_random, 2), (self.truncate_boundary, 2),
            (self.whole, 1), (self.delete_frame, 2), (self.duplicate_frame, 1),
            (self.insert_frame, 2), (self.swap_frames, 1), (self.record_field, 8),
            (self.change_kind, 3), (self.header, 2), (self.delete_record, 4),
            (self.insert_record, 2),
        ]  # fmt: skip
        op = self.rng.choices([o for o, _ in ops], [w for _, w in ops])[0]
        what, data = op(v)
        return Case(v, f"node {v}: {what}", data)

    # -- bytes

    def flip(self, v):
        raw = bytearray(self.raw[v])
        k = self.rng.choice((1, 1, 1, 2, 8))
        spots = [self.rng.randrange(len(raw)) for _ in range(k)]
        for i in spots:
            raw[i] ^= self.rng.randrange(1, 256)
        return f"flip bytes at {spots}", bytes(raw)

    def truncate_random(self, v):
        n = self.rng.randrange(len(self.raw[v]))
        return f"truncate at byte {n}", self.raw[v][:n]

    def truncate_boundary(self, v):
        n = self.rng.choice(self.logs[v].boundaries()[:-1])
        return f"truncate at record boundary {n}", self.raw[v][:n]

    def whole(self, v):
        choice = self.rng.randrange(3)
        if choice == 0:
            return "delete the log", None
        if choice == 1:
            return "empty the log", b""
        w = self.rng.choice([u for u in self.nodes if u != v] or [v])
        return f"replace with node {w}'s log", self.raw[w]

    # -- frames

    def _payloads(self, v):
        return list(self.logs[v].payloads)

    def delete_frame(self, v):
        ps = self._payloads(v)
        i = self.rng.randrange(len(ps))
        del ps[i]
        return f"delete frame {i}", self.logs[v].bytes(ps)

    def duplicate_frame(self, v):
        ps = self._payloads(v)
        i = self.rng.randrange(len(ps))
        ps.insert(i + 1, ps[i])
        return f"duplicate frame {i}", self.logs[v].bytes(ps)

    def insert_frame(self, v):
        ps = self._payloads(v)
        w = self.rng.choice(self.nodes)
        src = self.logs[w].payloads
        j, i = self.rng.randrange(len(src)), self.rng.randrange(len(ps) + 1)
        ps.insert(i, src[j])
        return f"insert node {w}'s frame {j} at {i}", self.logs[v].bytes(ps)

    def swap_frames(self, v):
        ps = self._payloads(v)
        if len(ps) < 2:
            return "swap nothing", self.raw[v]
        i = self.rng.randrange(len(ps) - 1)
        ps[i], ps[i + 1] = ps[i + 1], ps[i]
        return f"swap frames {i} and {i + 1}", self.logs[v].bytes(ps)

    # -- records

    def _records(self, v) -> list:
        return copy.deepcopy(self.logs[v].records)

    def _reframe(self, v, recs, what):
        return what, self.logs[v].magic + b"".join(frame(encode(r)) for r in recs)

    def _pick(self, recs, kinds=None) -> int:
        idx = [
            i
            for i, r in enumerate(recs)
            if i > 0 and isinstance(r, dict) and (kinds is None or r.get("k") in kinds)
        ]
        return self.rng.choice(idx) if idx else self.rng.randrange(1, max(2, len(recs)))

    def record_field(self, v):
        recs = self._records(v)
        i = self._pick(recs, EXCHANGE_KINDS if self.rng.random() < 0.7 else None)
        if i >= len(recs) or not isinstance(recs[i], dict):
            return "no record to change", self.raw[v]
        r = recs[i]
        names = [k for k in r if k != "k"] or ["step"]
        name = self.rng.choice(names + ["step", "peer", "digest", "value"])
        how = self.rng.randrange(6)
        old = r.get(name)
        if how == 0:
            r.pop(name, None)
            what = f"delete field {name!r}"
        elif how == 1:
            r[name] = self.rng.choice(ODD_VALUES)
            what = f"set {name!r} to {r[name]!r:.30}"
        elif how == 2 and isinstance(old, int) and not isinstance(old, bool):
            r[name] = old + self.rng.choice((-2, -1, 1, 2, 7))
            what = f"change {name!r} {old} -> {r[name]}"
        elif how == 3 and isinstance(old, str):
            r[name] = f"{self.rng.getrandbits(128):032x}"
            what = f"change {name!r} to another string"
        elif how == 4 and isinstance(old, np.ndarray):
            arr = np.array(old, copy=True)
            if arr.size:
                arr.flat[self.rng.randrange(arr.size)] += 1.0
            r[name] = arr
            what = f"change {name!r} array"
        else:
            r[f"extra{self.rng.randrange(3)}"] = self.rng.choice(ODD_VALUES)
            what = "add a field"
        return self._reframe(v, recs, f"record {i} ({r.get('k')}): {what}")

    def change_kind(self, v):
        recs = self._records(v)
        i = self._pick(recs)
        if i >= len(recs) or not isinstance(recs[i], dict):
            return "no record to change", self.raw[v]
        old = recs[i].get("k")
        recs[i]["k"] = self.rng.choice([k for k in KINDS if k != old])
        return self._reframe(v, recs, f"record {i}: kind {old} -> {recs[i]['k']}")

    def header(self, v):
        recs = self._records(v)
        h = recs[0]
        if not isinstance(h, dict):
            return "no header", self.raw[v]
        what = self.rng.choice(("node", "run_id", "params", "format", "version", "t_wall"))
        if what == "node":
            h["node"] = self.rng.choice([u for u in self.nodes if u != v] + [-1, "0", 1.0])
        elif what == "run_id":
            h["run_id"] = self.rng.choice(("other", 7, None))
        elif what == "params" and isinstance(h.get("params"), dict) and h["params"]:
            key = self.rng.choice(sorted(h["params"]))
            h["params"][key] = self.rng.choice(ODD_VALUES)
            what = f"params[{key!r}]"
        elif what == "format":
            h["format"] = "something-else"
        elif what == "version":
            h["version"] = 2
        else:
            h["t_wall"] = 0.0
        return self._reframe(v, recs, f"header {what} changed")

    def delete_record(self, v):
        recs = self._records(v)
        i = self._pick(recs, EXCHANGE_KINDS)
        if i >= len(recs):
            return "no record to delete", self.raw[v]
        kind = recs[i].get("k") if isinstance(recs[i], dict) else None
        del recs[i]
        renumber = self.rng.random() < 0.6
        if renumber:
            _renumber(recs)
        return self._reframe(
            v, recs, f"delete {kind} record {i}{' and renumber' if renumber else ''}"
        )

    def insert_record(self, v):
        recs = self._records(v)
        i = self._pick(recs, EXCHANGE_KINDS)
        if i >= len(recs) or not isinstance(recs[i], dict):
            return "no record to copy", self.raw[v]
        j = self.rng.randrange(1, len(recs) + 1)
        recs.insert(j, copy.deepcopy(recs[i]))
        _renumber(recs)
        return self._reframe(v, recs, f"copy record {i} ({recs[i].get('k')}) to {j}, renumber")


def _renumber(recs: list) -> None:
    seq = 0
    for r in recs[1:]:
        if isinstance(r, dict) and "seq" in r:
            r["seq"] = seq
            seq += 1


# ------------------------------------------------------------------------------------ checks


def entries(rep: dict) -> dict[tuple[int, int, str], dict]:
    return {
        (o["observer"], x["source"], x["method"]): x for o in rep["observers"] for x in o["losses"]
    }


def planned(run_dir: Path) -> dict[tuple[int, int, str], float]:
    """(observer, source, method) -> the plan's eps, through the family."""
    cfg, plan = audit.load_run(run_dir)
    per = family_of(cfg.protocol.name).planned_losses(cfg, plan, list(range(plan.n)))
    return {(v, u, m): p["eps"] for v, d in per.items() for (u, m), p in d.items()}


def verdict(rep: dict, base: dict, plan_eps: dict) -> str | None:
    """None when ``rep`` keeps the rule, else what is wrong."""
    got = entries(rep)
    if set(got) != set(plan_eps):
        missing = sorted(set(plan_eps) - set(got))[:3]
        return f"entries missing from the report, e.g. {missing}"
    same = all(
        got[k]["eps"] == x["eps"] and got[k]["factor"] == x["factor"]
        for k, x in entries(base).items()
    )
    if not rep["integrity"]:
        return None if same else "a loss changed and the report has no integrity finding"
    low = [
        (k, got[k]["eps"], e)
        for k, e in plan_eps.items()
        if not (isinstance(got[k]["eps"], float) and got[k]["eps"] >= e - 1e-12)
    ]
    if low:
        return f"{len(low)} entries below the plan, e.g. {low[0]}"
    if not rep.get("conservative"):
        return "integrity findings but the report is not marked conservative"
    return None


@dataclass
class Outcome:
    cases: int = 0
    failures: list[str] = field(default_factory=list)
    unchanged: int = 0  # cases whose report has no finding (and so equals the unmutated one)
    flagged: int = 0  # cases with integrity findings (every entry at least the plan's)
    raised: int = 0  # flagged cases where some entry was raised above the replay's own number


def fuzz(run_dir: Path, work: Path, cases: int, seed: int) -> Outcome:
    """``cases`` mutated logs of the run in ``run_dir``, each audited in a copy at ``work``."""
    run_dir, work = Path(run_dir), Path(work)
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(run_dir, work)
    base = audit.audit_run(work)
    plan_eps = planned(work)
    mut = Mutator(work, seed)
    out = Outcome()
    for _ in range(cases):
        c = mut.case()
        path = rundir.log_path(work, c.node)
        try:
            if c.data is None:
                path.unlink()
            else:
                path.write_bytes(c.data)
            try:
                rep = audit.audit_run(work)
            except Exception:
                out.failures.append(f"{c.what}: {traceback.format_exc(limit=-3)}")
                continue
            bad = verdict(rep, base, plan_eps)
            if bad:
                out.failures.append(f"{c.what}: {bad}")
            elif rep["integrity"]:
                out.flagged += 1
                out.raised += any(x.get("basis") != "realised" for x in entries(rep).values())
            else:
                out.unchanged += 1
        finally:
            path.write_bytes(mut.raw[c.node])
            out.cases += 1
    return out


def _fuzz_job(args) -> Outcome:
    run_dir, work, cases, seed = args
    return fuzz(Path(run_dir), Path(work), cases, seed)


def fuzz_many(runs: list[Path], work: Path, cases: int, seed: int, workers: int = 2) -> Outcome:
    """``cases`` in all, shared among ``runs``, in ``workers`` processes."""
    jobs, per = [], max(1, cases // (len(runs) * workers))
    for i, r in enumerate(runs):
        for k in range(workers):
            jobs.append((str(r), str(work / f"{i}-{k}"), per, seed * 1000 + i * workers + k))
    total = Outcome()
    if workers <= 1:
        results = map(_fuzz_job, jobs)
    else:
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(workers) as pool:
            results = pool.map(_fuzz_job, jobs, chunksize=1)
    for o in results:
        total.cases += o.cases
        total.failures += o.failures
        total.unchanged += o.unchanged
        total.flagged += o.flagged
        total.raised += o.raised
    return total


__all__ = [
    "Log", "Mutator", "Outcome", "encode", "entries", "frame", "fuzz", "fuzz_many", "planned",
    "verdict",
]  # fmt: skip
