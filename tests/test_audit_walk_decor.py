"""The walk and DECOR audits on damaged logs: whatever happened to a run's view logs (a log
deleted, cut at any record or byte, bytes flipped, a record rewritten with fields of the wrong
type or impossible values), ``family.audit`` returns a report, never raises, and never reports
less than the undamaged logs give: a report whose numbers differ from the original's names the
damage in ``integrity`` and is not fault-free. The families' planned and worst-case losses (what
the generic floor raises a damaged report to) match the plan report and dominate it."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pytest
from memrun import write_run_dir

from coordinator_free import config
from coordinator_free.accounting.loss import LOSS_KEYS
from coordinator_free.engine.memnet import Faults
from coordinator_free.families import family_of
from coordinator_free.families.walk import accountant as walk_acct
from coordinator_free.inmemory import run_config
from coordinator_free.viewlog import RESERVED_FIELDS, ViewLogWriter, read_viewlog

EX = Path(__file__).resolve().parent.parent / "examples"
NET = ["network.deadline_s=1"]
CASES = {
    "ring-sum": (EX / "ring-sum.toml", ["graph.nodes=4", "protocol.cycles=2"]),
    "complete-sum": (
        EX / "complete-sum.toml",
        ["graph.nodes=4", "protocol.hops=12", "protocol.tokens=2"],
    ),
    "walk-sgd": (EX / "walk-sgd.toml", ["graph.dim=2", "protocol.hops=12"]),
    "decor": (EX / "decor-ring.toml", ["graph.nodes=4", "protocol.rounds=3"]),
}
#: Values of the wrong type, or impossible, for any field of a record.
BAD_VALUES = ("junk", -3, 10**6, None, [1, "a"], 2.5, True, {"x": 1})
#: Cases tried per family, counted by the tests (the report of the run says how many).
TRIED: dict[str, int] = {}


class Run:
    """One fault-free in-memory run written as a run directory, its audit and its logs' bytes."""

    def __init__(self, name: str, root: Path, seed: int = 3):
        path, sets = CASES[name]
        self.name = name
        self.cfg = config.load(path, [*sets, *NET])
        self.fam = family_of(self.cfg.protocol.name)
        self.plan = self.fam.make_plan(self.cfg)
        self.dir = write_run_dir(self.cfg, run_config(self.cfg, seed=seed), root / f"{name}-{seed}")
        self.original = self.audit()
        assert self.original["fault_free"] is True, self.original["integrity"]
        self.bytes = {v: self.log(v).read_bytes() for v in range(self.plan.n)}
        self.holders = None
        if self.fam.walks(self.cfg):
            self.holders = [w.holders for w in walk_acct.replay(self.dir, self.plan, []).walks]

    def log(self, v: int) -> Path:
        return self.dir / "logs" / f"node-{v}.vlog"

    def audit(self) -> dict:
        return self.fam.audit(self.dir, self.cfg, self.plan, None)

    def restore(self) -> None:
        for v, data in self.bytes.items():
            self.log(v).write_bytes(data)


def entries(rep: dict) -> dict:
    return {
        (o["observer"], x["source"], x["method"]): (x["factor"], x["rdp"], x["eps"])
        for o in rep["observers"]
        for x in o["losses"]
    }


def check_damaged(run: Run, what: str) -> dict:
    """Audit the damaged logs now in ``run.dir`` and check the rule (module doc)."""
    try:
        rep = run.audit()
    except Exception as exc:  # the test's point: name the case that raised
        raise AssertionError(f"{run.name}, {what}: the audit raised {exc!r}") from exc
    TRIED[run.name] = TRIED.get(run.name, 0) + 1
    before, after = entries(run.original), entries(rep)
    findings = rep["integrity"]
    for f in findings:
        assert set(f) >= {"node", "kind", "message"}, (what, f)
    if findings:
        assert rep["fault_free"] is False and rep["complete"] is False, what
    else:
        assert after == before, f"{run.name}, {what}: numbers changed without a finding"
        assert rep["fault_free"] is True, what
    for key, (_, _, eps) in after.items():
        if key in before:
            assert eps >= before[key][2] * (1 - 1e-12), (
                f"{run.name}, {what}: {key} reports eps {eps}, the intact logs give "
                f"{before[key][2]}"
            )
    if run.holders is not None:
        walks = walk_acct.replay(run.dir, run.plan, []).walks
        for w, ref in zip(walks, run.holders, strict=True):
            known = np.flatnonzero(w.holders >= 0)
            known = known[known < ref.size]
            assert np.array_equal(w.holders[known], ref[known]), (
                f"{run.name}, {what}: token {w.token} rebuilt as {w.holders.tolist()}, the walk "
                f"was {ref.tolist()}"
            )
    return rep


@pytest.fixture(scope="module", params=list(CASES))
def run(request, tmp_path_factory):
    return Run(request.param, tmp_path_factory.mktemp("runs"))


def rewrite(path: Path, records: list[dict], header: dict) -> None:
    """Write ``records`` as a fresh view log with valid frames (the writer fills seq and times)."""
    path.unlink()
    with ViewLogWriter(
        path, run_id=header["run_id"], node=header["node"], params=header["params"]
    ) as w:
        for r in records:
            w.write(r["k"], **{k: x for k, x in r.items() if k not in RESERVED_FIELDS})


# ------------------------------------------------------------------------------------ damage


def test_a_deleted_log_is_a_finding_never_an_exception(run):
    for v in range(run.plan.n):
        run.log(v).unlink()
        try:
            rep = check_damaged(run, f"log of node {v} deleted")
        finally:
            run.restore()
        assert {"node": v, "kind": "missing-log"}.items() <= rep["integrity"][0].items()


@pytest.mark.slow  # exhaustive or long: in the slow suite, which CI runs
def test_logs_cut_at_every_record_and_inside_records(run):
    rng = random.Random(7)
    for v in range(run.plan.n):
        vl = read_viewlog(run.log(v))
        data = run.bytes[v]
        cuts = {0, 5, *vl.offsets, *(rng.randrange(len(data)) for _ in range(3))}
        for cut in sorted(cuts):
            run.log(v).write_bytes(data[:cut])
            try:
                rep = check_damaged(run, f"node {v}'s log cut at byte {cut}")
            finally:
                run.restore()
            assert rep["integrity"], f"node {v} cut at {cut} of {len(data)} bytes: no finding"


def test_flipped_bytes(run):
    rng = random.Random(11)
    for i in range(40):
        v = rng.randrange(run.plan.n)
        data = bytearray(run.bytes[v])
        for _ in range(1 + i % 3):
            pos = rng.randrange(len(data))
            data[pos] ^= 1 << rng.randrange(8)
        run.log(v).write_bytes(bytes(data))
        try:
            check_damaged(run, f"case {i}: bytes of node {v}'s log flipped")
        finally:
            run.restore()


@pytest.mark.slow  # exhaustive or long: in the slow suite, which CI runs
def test_records_rewritten_with_wrong_types_or_impossible_values(run):
    """A field of every record the audit reads, set to a wrong value (or removed), in a log
    whose frames and checksums are valid."""
    rng = random.Random(5)
    used = (
        ("token-", "walk-end", "commit-assumed")
        if run.fam.walks(run.cfg)
        else ("send", "recv", "late", "decor-")
    )
    flagged = 0
    for v in range(run.plan.n):
        vl = read_viewlog(run.log(v))
        for i, r in enumerate(vl.records):
            if not r["k"].startswith(used):
                continue
            fields = sorted(set(r) - RESERVED_FIELDS)
            for field in rng.sample(fields, 1):
                bad = dict(r)
                change = rng.choice([*BAD_VALUES, "remove"])
                if change == "remove":
                    del bad[field]
                else:
                    bad[field] = change
                rewrite(run.log(v), [*vl.records[:i], bad, *vl.records[i + 1 :]], vl.header)
                try:
                    rep = check_damaged(run, f"node {v} {r['k']} seq {i}: {field} = {change!r}")
                finally:
                    run.restore()
                flagged += bool(rep["integrity"])
    assert flagged, "no rewritten record was ever flagged"


def test_an_impossible_token_record_is_named(tmp_path):
    """The kinds of damage the walk audit names: a token id out of range, a step beyond the
    walk, a hand-off to a node that is not a neighbour, a value without its digest."""
    run = Run("ring-sum", tmp_path)
    vl = read_viewlog(run.log(1))
    seen = next(i for i, r in enumerate(vl.records) if r["k"] == "token-seen")
    for field, value, says in (
        ("token", 5, "not a token id"),
        ("step", run.plan.hops + 3, "not in 1.."),
        ("peer", 3, "cannot hand a token"),
        ("digest", None, "no digest"),
    ):
        bad = {**vl.records[seen], field: value}
        if field == "digest":  # neither the digest nor the value it is the digest of
            del bad["digest"], bad["value"]
        rewrite(run.log(1), [*vl.records[:seen], bad, *vl.records[seen + 1 :]], vl.header)
        rep = check_damaged(run, f"token-seen {field} = {value!r}")
        run.restore()
        (f,) = [f for f in rep["integrity"] if f["kind"] == "impossible-record"]
        assert f["node"] == 1 and says in f["message"], f


def test_a_missing_holder_log_is_rebuilt_from_its_neighbours_or_left_to_the_worst_case(
    tmp_path,
):
    """The ring's walk is public: without a holder's log the audit still has every step and
    the same losses for the others. Off the ring, a step no log can tell is never guessed: the
    observers who saw the token after it get the worst case, at least the plan."""
    ring = Run("ring-sum", tmp_path)
    ring.log(1).unlink()
    rep = check_damaged(ring, "ring-sum without node 1's log")
    assert [w["unknown_steps"] for w in rep["walks"]] == [0] * ring.plan.tokens
    before = entries(ring.original)
    assert {k: x for k, x in entries(rep).items()} == {k: x for k, x in before.items() if k[0] != 1}
    assert all(o["basis"] == "realised walk" for o in rep["observers"])

    # Which pairs of missing logs a run's walks let the audit rebuild depends on the walks
    # (drawn from the nodes' keys): runs are tried until both cases have happened.
    rebuilt = guessed_not = 0
    for seed in range(3, 13):
        if rebuilt and guessed_not:
            break
        r, g = _drop_pairs_of_logs(Run("complete-sum", tmp_path, seed))
        rebuilt, guessed_not = rebuilt + r, guessed_not + g
    assert rebuilt and guessed_not, (rebuilt, guessed_not)


def _drop_pairs_of_logs(comp: Run) -> tuple[int, int]:
    """Audit ``comp`` without each pair of its logs in turn; how many pairs the audit rebuilt
    from the other logs, and how many it left to the worst case (checking both)."""
    planned = comp.fam.planned_losses(comp.cfg, comp.plan, range(comp.plan.n))
    ldp = walk_acct.ldp_baseline(comp.plan)
    before = entries(comp.original)
    rebuilt = guessed_not = 0
    for gone in itertools.combinations(range(comp.plan.n), 2):
        for v in gone:
            comp.log(v).unlink()
        try:
            rep = check_damaged(comp, f"complete-sum without the logs of nodes {gone}")
        finally:
            comp.restore()
        unknown = sum(w["unknown_steps"] for w in rep["walks"])
        rebuilt += unknown == 0
        guessed_not += unknown > 0
        for o in rep["observers"]:
            v = o["observer"]
            for x in o["losses"]:
                key = (x["source"], x["method"])
                if o["basis"] == "realised walk":
                    assert (x["factor"], x["rdp"], x["eps"]) == before[(v, *key)]
                else:
                    assert x["eps"] >= max(planned[v][key]["eps"], ldp["eps"]), (gone, v, x)
        if unknown == 0:
            assert all(o["basis"] == "realised walk" for o in rep["observers"]), gone
    return rebuilt, guessed_not


# ------------------------------------------------------------------------------------ DECOR


def test_a_killed_decor_node_is_unfinished_and_an_edited_digest_is_flagged(tmp_path):
    cfg = config.load(CASES["decor"][0], ["graph.nodes=5", "protocol.rounds=4", *NET])
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    for victim in range(plan.n):
        run = run_config(cfg, Faults(crash_at_step={victim: 1 + victim % 3}), seed=victim)
        assert run.outcome[victim] == "crashed"
        out = write_run_dir(cfg, run, tmp_path / f"kill{victim}")
        rep = fam.audit(out, cfg, plan, None)
        assert rep["fault_free"] is False and rep["complete"] is False
        assert (victim, "unfinished") in {(f["node"], f["kind"]) for f in rep["integrity"]}

    out = write_run_dir(cfg, run_config(cfg, seed=0), tmp_path / "clean")
    path = out / "logs" / "node-2.vlog"
    vl = read_viewlog(path)
    recv = next(i for i, r in enumerate(vl.records) if r["k"] == "recv")
    edited = {**vl.records[recv], "digest": "0" * 32}
    rewrite(path, [*vl.records[:recv], edited, *vl.records[recv + 1 :]], vl.header)
    rep = fam.audit(out, cfg, plan, None)
    assert rep["fault_free"] is False
    assert [(f["node"], f["kind"]) for f in rep["integrity"]] == [(2, "digest-mismatch")]


def test_decor_seed_exchange_and_round_records_are_checked(tmp_path):
    """A pair commitment the other end logged differently, a round's terms of a pair the log
    never established, and a round logged twice are findings; the round counts its node as a
    colluder, so the losses only grow."""
    run = Run("decor", tmp_path)
    vl = read_viewlog(run.log(0))
    recs = vl.records
    i_pair = next(i for i, r in enumerate(recs) if r["k"] == "decor-pair")
    i_noise = next(i for i, r in enumerate(recs) if r["k"] == "decor-noise")
    for what, new, kind in (
        (
            "pair commitment changed",
            [*recs[:i_pair], {**recs[i_pair], "commit": "f" * 32}, *recs[i_pair + 1 :]],
            "pair-commit-mismatch",
        ),
        (
            "round commitment changed",
            [
                *recs[:i_noise],
                {**recs[i_noise], "commits": ["e" * 32, *recs[i_noise]["commits"][1:]]},
                *recs[i_noise + 1 :],
            ],
            "pair-mismatch",
        ),
        (
            "round record repeated",
            [*recs[: i_noise + 1], recs[i_noise], *recs[i_noise + 1 :]],
            "impossible-record",
        ),
        (
            "terms of a pair never established",
            [r for i, r in enumerate(recs) if i != i_pair],
            "impossible-record",
        ),
    ):
        rewrite(run.log(0), new, vl.header)
        rep = check_damaged(run, what)
        run.restore()
        assert kind in {f["kind"] for f in rep["integrity"]}, (what, rep["integrity"])


# ------------------------------------------------------------------------------ the two methods


@pytest.mark.parametrize("name", list(CASES))
def test_planned_losses_are_the_plan_report_and_the_worst_case_dominates(name):
    path, sets = CASES[name]
    cfg = config.load(path, [*sets, *NET])
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    observers = list(range(plan.n))
    planned = fam.planned_losses(cfg, plan, observers)
    worst = fam.worst_case_losses(cfg, plan, observers)
    assert sorted(planned) == sorted(worst) == observers
    checked = 0
    for method in ("exact", "paper"):
        # local DP in the method's conversion (a paper bound is capped by its RDP one)
        ldp = fam.plan_report(cfg, plan, source=None, method=method)["ldp"]
        for src in range(plan.n):
            rep = fam.plan_report(cfg, plan, source=src, method=method)
            for x in rep["losses"]:
                v = x["observer"]
                got = planned[v][(src, method)]
                assert got == {k: x[k] for k in LOSS_KEYS if k in x}
                w = worst[v][(src, method)]
                assert set(w) == set(got)
                assert w["eps"] >= got["eps"] and w["eps"] >= ldp["eps"]
                for key in ("factor", "rdp"):
                    if got[key] is not None:
                        assert w[key] >= got[key]
                checked += 1
    assert checked == 2 * plan.n * (plan.n - 1)
    assert all(len(cells) == 2 * (plan.n - 1) for cells in planned.values())
