"""Exploring the token hand-off on the in-memory network: seeded schedules of every fault
kind (loss, duplication, delay and reordering, corrupted frames, a killed, stopped or cut node,
a cut link and its heal, NaN sends) and mixes of them, on every token protocol. Every schedule
must keep the hand-off's invariants:

* at most one holder per walk and step: no two ``token-step`` records name the same
  (token, step), on one node or two;
* every token value a node decodes is logged with its step and its value or digest, in every
  phase, the goodbye included;
* every node ends with a named outcome, and every walk that ended at a node ended one of the
  engine's named ways (:data:`coordinator_free.engine.token.WALK_ENDS`);
* the audit of the run's logs finds no impossible record and no double step, and never reports
  less than the exact loss of the walks that really happened, with every sight the nodes really
  had (both known here from outside the logs).

The quick variant runs a few hundred schedules; ``-m slow`` runs many more (its size is
``WALK_EXPLORATION_PER_PROTOCOL``, default 3,000 per protocol, one worker process per core)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from coordinator_free import config
from coordinator_free.engine.events import Inbound, Log
from coordinator_free.engine.memnet import Faults
from coordinator_free.engine.token import WALK_ENDS
from coordinator_free.families import family_of
from coordinator_free.families.walk import accountant as audit_walk
from coordinator_free.inmemory import run_config

EX = Path(__file__).resolve().parent.parent / "examples"
DEADLINE = 1.0
PROTOCOLS = {
    "ring-sum": ["graph.nodes=6", "protocol.cycles=3"],
    "ring-histogram": ["graph.nodes=6", "protocol.cycles=3"],
    "complete-sum": ["graph.nodes=6", "protocol.hops=30", "protocol.tokens=2", "protocol.cap=6"],
    "complete-histogram": ["graph.nodes=6", "protocol.hops=30"],
    "complete-sgd": ["graph.nodes=6", "protocol.hops=20", "protocol.cap=6"],
    "walk-sgd": ["graph.kind=ring", "graph.nodes=6", "protocol.hops=20", "protocol.cap=6",
                 "protocol.tokens=2"],
    "admm": ["graph.nodes=6", "protocol.hops=20", "protocol.tokens=2", "data.samples=240",
             "data.features=8"],
}  # fmt: skip
#: The example each protocol's config starts from (default: examples/<name>.toml).
EXAMPLE = {"admm": "admm-lasso"}
KINDS = ("drop", "duplicate", "reorder", "corrupt", "kill", "stop", "cut", "cut-heal", "link",
         "nan")  # fmt: skip


def cfg_of(name: str, specs: list[str] | None = None):
    sets = [*PROTOCOLS[name], f"network.deadline_s={DEADLINE}"]
    return config.load(EX / f"{EXAMPLE.get(name, name)}.toml", sets, specs or [])


def schedule(name: str, seed: int, only: str | None = None) -> tuple[list[str], dict, list[str]]:
    """Schedule ``seed`` of protocol ``name``: the declared fault specs, the in-memory
    network's own faults (reordering, a cut link), and the kinds it mixes (one to three; or
    just ``only``)."""
    rng = random.Random(f"{name}/{seed}")
    kinds = rng.sample(KINDS, 1 if seed % 3 else rng.randint(2, 3))
    if only is not None:
        kinds = [only]
    n = 6
    specs: list[str] = []
    extra: dict = {}
    for kind in kinds:
        node, at = rng.randrange(n), rng.randint(1, 12)
        if kind == "drop":
            specs.append(f"drop:{rng.choice([0.05, 0.1, 0.2, 0.3])}")
        elif kind == "duplicate":
            specs.append(f"duplicate:{rng.choice([0.1, 0.3, 0.5])}")
        elif kind == "corrupt":
            specs.append(f"corrupt:{rng.choice([0.02, 0.05, 0.1])}")
        elif kind == "reorder":
            extra["delay"] = (0.001, rng.choice([0.3, 1.0, 2.5]) * DEADLINE)
            extra["reorder"] = True
        elif kind == "kill":
            specs.append(f"kill:{node}@{at}")
        elif kind == "stop":
            specs.append(f"stop:{node}@{at}+{rng.choice([1, 2.5, 4, 6, 9])}")
        elif kind == "cut":
            specs.append(f"cut:{node}@{at}")
        elif kind == "cut-heal":
            specs += [f"cut:{node}@{at}", f"heal:{node}@{at + rng.randint(1, 6)}"]
        elif kind == "link":
            a, b = rng.sample(range(n), 2)
            t0 = rng.uniform(0.0, 0.05)
            end = None if rng.random() < 0.3 else t0 + rng.uniform(0.01, 6 * DEADLINE)
            extra["partitions"] = [(a, b, t0, end)]
        elif kind == "nan":
            specs.append(f"nan:{node}@{at}")
    return specs, extra, kinds


class Watched:
    """A node's engine, watched from outside: every token value handed to it (the decoded
    message) and every step it makes, to check its log against."""

    def __init__(self, engine, problems: list[str], sights: set, node: int):
        self.engine, self.problems, self.sights, self.node = engine, problems, sights, node

    def start(self, now):
        return self.engine.start(now)

    def next_wakeup(self):
        return self.engine.next_wakeup()

    def handle(self, event, now):
        was_finished = self.engine.finished
        actions = self.engine.handle(event, now)
        if (
            isinstance(event, Inbound)
            and event.message.kind == "token"
            and event.message.payload is not None
            and not was_finished
        ):
            m = event.message
            if np.isfinite(m.payload).all():  # a NaN send reveals nothing of the walk
                self.sights.add((self.node, m.round, m.step))
            logged = [
                a.fields
                for a in actions
                if isinstance(a, Log)
                and a.fields.get("token") == m.round
                and m.step in (a.fields.get("step"), a.fields.get("at"))
                and ("digest" in a.fields or "value" in a.fields)
            ]
            if not logged:
                self.problems.append(
                    f"node {self.node} decoded token {m.round} step {m.step} and logged "
                    f"{[a.kind for a in actions if isinstance(a, Log)]}"
                )
        return actions


def explore(name: str, seed: int, tmp_path: Path | None = None, only: str | None = None) -> dict:
    """Run schedule ``seed`` of ``name``, check the invariants; returns what happened."""
    specs, extra, kinds = schedule(name, seed, only)
    cfg = cfg_of(name, specs)
    problems: list[str] = []
    sights: set = set()
    fam = family_of(cfg.protocol.name)

    def engine_of(cfg, plan, v, streams):
        return Watched(fam.node_engine(cfg, plan, v, streams), problems, sights, v)

    run = run_config(cfg, Faults.of_config(cfg, **extra), seed=seed, engine_of=engine_of)
    plan = fam.make_plan(cfg)
    where = f"{name} schedule {seed} {specs} {extra}"
    assert not problems, (where, problems[:5])

    # At most one holder per walk and step.
    holder: dict[tuple[int, int], int] = {}
    data: dict[tuple[int, int], bool] = {}
    for v, records in run.logs.items():
        for k, f in records:
            if k == "token-step":
                key = (f["token"], f["step"])
                assert key not in holder, (where, key, holder.get(key), v)
                holder[key], data[key] = v, f["data"]
    # Every step of a walk was made after the one before it (no holes in a walk).
    for j in range(plan.tokens):
        made = sorted(s for (t, s) in holder if t == j)
        assert made == list(range(len(made))), (where, j, made)

    # A named outcome per node and per walk.
    assert set(run.outcome.values()) <= {"finished", "crashed"}, (where, run.outcome)
    outcomes = set()
    for v, res in run.results.items():
        if run.outcome[v] != "finished":
            continue
        ended = res["walks"]["ended"]
        assert sorted(int(j) for j in ended) == list(range(plan.tokens)), (where, v, ended)
        outcomes |= {e["how"] for e in ended.values()}
    assert outcomes <= set(WALK_ENDS), (where, outcomes)
    completed = all(
        e["how"] == "completed"
        for v, res in run.results.items()
        if res is not None
        for e in res["walks"]["ended"].values()
    ) and set(run.outcome.values()) == {"finished"}

    if tmp_path is not None:
        from memrun import write_run_dir

        from coordinator_free.accounting import audit

        out = write_run_dir(cfg, run, tmp_path / f"{name}-{seed}")
        rep = audit.audit_run(out)
        bad = [i for i in rep["integrity"] if i["kind"] in ("impossible-record", "double-step")]
        assert not bad, (where, bad)
        # The truth, from outside the logs: who made each step, whether data went in, and
        # every value each node decoded.
        walks = []
        for j in range(plan.tokens):
            length = sum(1 for (t, _) in holder if t == j)
            seen: dict[int, list[int]] = {}
            for v, t, s in sights:
                if t == j:
                    seen.setdefault(v, []).append(s)
            walks.append(
                audit_walk.RealisedWalk(
                    token=j,
                    holders=np.array([holder[(j, s)] for s in range(length)], dtype=np.int64),
                    data=np.array([data[(j, s)] for s in range(length)], dtype=bool),
                    seen={v: np.array(sorted(set(x)), dtype=np.int64) for v, x in seen.items()},
                )
            )
        if plan.kind == "admm":
            truth = _admm_truth(plan, walks)
        else:
            truth = audit_walk.exact_losses(plan, walks, range(plan.n))
        for o in rep["observers"]:
            v = o["observer"]
            for x in o["losses"]:
                if x["method"] == "exact":
                    want = truth[v][x["source"]]["eps"]
                    assert x["eps"] >= want * (1 - 1e-9) - 1e-12, (where, v, x, want)
    return {"kinds": kinds, "completed": completed, "outcomes": outcomes, "end": run.end_time}


def _admm_truth(plan, walks) -> dict[int, list[dict]]:
    """ADMM's exact losses for the true walks (each source's real contributions, Theorem 8.12
    capped by local DP), observer -> [entry of every source]: what the audit may not go below.

    Only the steps that were made count: a walk that ended early has none past its end. The
    audit, from the logs, counts a step no log tells for every source, and a step offered to a
    node that logged no step for it as that node's (it was that node's or nobody's): both at
    least what happened (schedule 4350: token 1's step 6 is offered to node 0 and never made)."""
    from coordinator_free.families.admm import accountant as aa

    steps = [[[] for _ in range(plan.tokens)] for _ in range(plan.n)]
    for w in walks:
        for s, h in enumerate(w.holders[: plan.hops].tolist()):
            steps[h][w.token].append(s + 1)
    per = []
    for u in range(plan.n):
        ldp = aa.ldp_entry(plan, sum(len(x) for x in steps[u]))
        per.append(aa.theorem_entry(plan, "exact", ldp, contributions=steps[u]))
    return {v: per for v in range(plan.n)}


QUICK = 40  # schedules per protocol in the quick suite
#: Fewer for admm, whose audits evaluate Theorem 8.12 numerically (the slow sweep runs 3,000)
QUICK_OF = {"admm": 15}
AUDIT_EVERY = 5  # the audit check on every fifth schedule


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_explored_schedules_keep_the_hand_off_invariants(name, tmp_path):
    results = [
        explore(name, seed, tmp_path if seed % AUDIT_EVERY == 0 else None)
        for seed in range(QUICK_OF.get(name, QUICK))
    ]
    # The exploration reaches both ends: walks that complete despite faults, and named failures.
    assert any(r["completed"] for r in results)
    assert any(not r["completed"] for r in results)


def _explore_range(name: str, seeds: range, tmp: str) -> int:
    """Schedules ``seeds`` of ``name`` (one worker's share), the audit check on every
    thirtieth; returns how many ran (an invariant broken raises)."""
    for seed in seeds:
        explore(name, seed, Path(tmp) if seed % 30 == 0 else None)
    return len(seeds)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_many_explored_schedules_keep_the_hand_off_invariants(name, tmp_path):
    """3,000 schedules per protocol by default (WALK_EXPLORATION_PER_PROTOCOL), shared among
    one worker process per core, the audit check on every thirtieth."""
    count = int(os.environ.get("WALK_EXPLORATION_PER_PROTOCOL", "3000"))
    workers = max(1, min(os.cpu_count() or 1, 4))
    seeds = range(QUICK, QUICK + count)
    shares = [seeds[i::workers] for i in range(workers)]
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = [
            pool.submit(_explore_range, name, share, str(tmp_path / f"w{i}"))
            for i, share in enumerate(shares)
        ]
        done = sum(f.result() for f in futures)
    assert done == count


#: A run of every way a walk can end: (protocol, declared faults, in-memory network faults).
ENDINGS = {
    "completed": ("ring-sum", [], {}),
    # the holder of step 4 dies right after offering step 5: its custodian ends the walk lost
    "lost": ("ring-sum", ["kill:4@5"], {}),
    # the ring's link 2-3 is cut: node 2 has no other next hop
    "stuck": ("ring-sum", [], {"partitions": [(2, 3, 0.0005, None)]}),
    # node 4 loses both ring neighbours before the walk's end can reach it
    "cut-off": ("ring-sum", ["cut:4@2"], {}),
    # token 0's start node dies before its first hand-off is committed: nobody holds custody,
    # and the walk ends by the run-level bound
    "timeout": ("complete-sum", [], {"crash": {0: 0.0005}}),
}


def test_the_endings_are_one_vocabulary():
    assert set(ENDINGS) == set(WALK_ENDS)
    assert audit_walk._WALK_ENDS is WALK_ENDS


@pytest.mark.parametrize("how", list(ENDINGS))
def test_every_walk_ending_passes_the_audit(how, tmp_path):
    from memrun import write_run_dir

    from coordinator_free.accounting import audit

    name, specs, extra = ENDINGS[how]
    cfg = cfg_of(name, specs)
    run = run_config(cfg, Faults.of_config(cfg, **extra), seed=0)
    ends = [
        e for res in run.results.values() if res is not None for e in res["walks"]["ended"].values()
    ]
    assert how in {e["how"] for e in ends}, ends
    logged = [f for v in run.logs for k, f in run.logs[v] if k in ("walk-end", "walk-timeout")]
    assert logged
    rep = audit.audit_run(write_run_dir(cfg, run, tmp_path / how))
    assert not [i for i in rep["integrity"] if i["kind"] in ("impossible-record", "double-step")]
    assert rep["fault_free"] is (how == "completed")


def test_a_holder_paused_past_the_grace_period_learns_the_walk_ended_and_makes_no_step():
    """Node 1 stops while it holds token 0 (it offered the next step and waits for the ack),
    for longer than the silence verdict and the grace period: its custodian ends the walk lost
    at 1, while token 1 walks on. Node 1, resumed, is told the walk ended, logs that its
    hand-off is stale, and never makes another step of token 0; nobody else does either."""
    cfg = config.load(
        EX / "complete-sum.toml",
        [
            "graph.nodes=6",
            "protocol.hops=300",
            "protocol.tokens=2",
            f"network.deadline_s={DEADLINE}",
        ],
        ["stop:1@40+12"],
    )
    run = run_config(cfg, Faults.of_config(cfg, delay=(0.001, 0.1)), seed=0)
    assert set(run.outcome.values()) == {"finished"}
    ends = {v: res["walks"]["ended"] for v, res in run.results.items()}
    assert all(e["0"]["how"] == "lost" and e["0"]["at"] == 1 for e in ends.values()), ends
    assert all(e["1"]["how"] == "completed" for e in ends.values()), ends
    log1 = run.logs[1]
    stale = [i for i, (k, f) in enumerate(log1) if k == "token-stale" and f["token"] == 0]
    assert stale
    assert not [f for k, f in log1[stale[0] :] if k == "token-step" and f["token"] == 0]
    made0 = [(v, f["step"]) for v in run.logs for f in run.records(v, "token-step")
             if f["token"] == 0]  # fmt: skip
    last = max(s for _, s in made0)
    assert [v for v, s in made0 if s == last] == [1]  # the walk stopped where it was lost
    assert sorted(s for _, s in made0) == list(range(last + 1))


TIMINGS = 40  # fault-free schedules per protocol, one path, different delays


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_a_fault_free_run_sends_the_same_messages_whatever_the_timing(name):
    """Fault-free, the same walks (same streams) under TIMINGS different delay schedules (0.1 ms
    to 300 ms per message, in order per link, under the deadline): every node sends and
    receives the same number of messages and logs the same records, so a real run's traffic
    and view logs can be pinned (tests/golden/runs/ring-sum.json). Messages sent only because
    of which arrived first (an end answered to a hand-off message whose sender waits for no
    answer) would break it."""
    cfg = cfg_of(name)
    outcomes = {}
    for t in range(TIMINGS):
        run = run_config(cfg, Faults(delay=(0.0001, 0.3)), seed=0, net_seed=t)
        assert set(run.outcome.values()) == {"finished"}, run.outcome
        traffic = {v: (r["messages_sent"], r["messages_received"]) for v, r in run.results.items()}
        records = {v: Counter(k for k, _ in log if k != "peer-done") for v, log in run.logs.items()}
        outcomes.setdefault(repr((traffic, records)), []).append(t)
    assert len(outcomes) == 1, (
        f"{len(outcomes)} different outcomes; timings: {list(outcomes.values())}"
    )
