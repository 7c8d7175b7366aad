"""Planning and auditing of ``decor``: the SecLDP accountant on the planned or realised pairs.

Two views of every run (docs/privacy.md §11):

* **The guarantee at the configured collusion level q** (``secldp``): every user's loss against
  any coalition of q users who pool their pair secrets and see *every* message (q = 0: an
  external eavesdropper). ``exact`` is ``(Delta^2/2) [Sigma_H^{-1}]_ii`` per round (Algorithms
  2/3 of the DECOR paper), worst over the coalitions, summed over rounds; ``paper`` is the
  closed form of Theorems 1/6 with the algebraic connectivity a_q. Both convert to (eps, delta)
  with the improved RDP conversion, and the paper's conversion is printed next to it.
* **Pairwise losses** (the table every protocol has): observer v is a curious user (Q = {v}, it
  sees every message and knows its own pair secrets), source u any other user; the same
  accountant. In units of one round of local DP at sigma, like every other protocol.

``plan`` assumes every pair is active in every round. ``audit`` rebuilds each round from the
logs: which nodes published a value (a send in its log, or a receipt in a neighbour's), which
pair terms each node added (its ``decor-noise`` record) and whether both ends of a pair used
the same secret (equal commitments). A node whose log is missing or lacks a round's record is
treated as a colluder for that round (the adversary is given its secrets): a stronger adversary,
so the audit stays an upper bound; that node's own value of the round, published with its
terms known, is charged the round's local-DP loss. Every record is checked before it is used
(:func:`replay_rounds`): what fails is an integrity finding, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

from coordinator_free import graphs
from coordinator_free.accounting import loss, summary
from coordinator_free.accounting.core import (
    AuditError,
    audit_head,
    read_logs,
    scan_exchanges,
    units_of,
)
from coordinator_free.privacy import decor as dacct

if TYPE_CHECKING:
    from coordinator_free.config import Config

#: Largest n for the pairwise (curious-user) table: one eigendecomposition per observer.
PAIRWISE_MAX_N = 256


def accounting_note(plan) -> str:
    return (
        "decor: SecLDP (user level; the adversary sees every message and knows the pair secrets "
        "of its coalition). 'exact' is (Delta^2/2)[Sigma_H^-1]_ii per round with Sigma_H = "
        "sigma^2 I + sigma_cor^2 L_H (Algorithms 2/3), 'paper' the closed form of Theorems 1/6 "
        "with the algebraic connectivity; rounds compose additively in RDP. Pairwise losses: "
        "observer v is a curious user (collusion level 1, Q = {v})"
    )


def ldp_baseline(plan, method: str = "exact") -> dict:
    """Local DP over the run: R rounds of a Gaussian mechanism at sigma."""
    return units_of(plan).method(method)(float(plan.rounds)).entry()


def secldp_block(plan, rho_exact: np.ndarray, rho_paper: float, a_q: float) -> dict:
    """The guarantee at collusion level q: the worst user, exact (the Gaussian profile of its
    view) and the closed form (a Renyi bound), each with the other conversions beside it."""
    return {
        "collusion": plan.collusion,
        "adversary": "external eavesdropper"
        if plan.collusion == 0
        else f"any {plan.collusion} colluding user(s) seeing every message",
        "algebraic_connectivity": a_q,
        **summary.guarantee(rho_exact, rho_paper, plan.delta, plan.alpha),
    }


def summarise(plan, F: np.ndarray, method: str) -> dict:
    return summary.of_factors(
        F, graphs.all_distances(plan.graph), units_of(plan).method(method), float(plan.rounds)
    )


def plan_pairwise(plan, method: str, curious: dacct.SpectralGraph | None = None) -> np.ndarray:
    """F[v, u]: user u against the curious user v over the whole run, in units of one round of
    local DP. ``curious``: the graph's collusion-1 SpectralGraph, if already built."""
    n = plan.n
    if n > PAIRWISE_MAX_N:
        raise AuditError(
            f"the pairwise decor table needs one eigendecomposition per observer; n = {n} is "
            f"above {PAIRWISE_MAX_N} (the SecLDP guarantee is still computed)"
        )
    return _pairwise(plan, method, curious)


def _pairwise(plan, method: str, curious: dacct.SpectralGraph | None = None) -> np.ndarray:
    """:func:`plan_pairwise` without the size limit."""
    n, R = plan.n, plan.rounds
    if method == "exact":
        sg = curious if curious is not None else dacct.SpectralGraph(plan.graph, collusion=1)
        F = sg.pairwise_rho(plan.sigma, plan.sigma_cor, plan.sensitivity)
    else:
        F = np.zeros((n, n))
        for v in range(n):
            rest = plan.graph.subgraph([u for u in range(n) if u != v])
            a = _lambda2(rest)
            F[v, :] = dacct.closed_form_rho(n - 1, a, plan.sigma, plan.sigma_cor, plan.sensitivity)
        np.fill_diagonal(F, 0.0)
    return R * F / units_of(plan).ldp_rho


def _lambda2(g: nx.Graph) -> float:
    """Algebraic connectivity of g (any node labels); 0 if disconnected or a single node."""
    if g.number_of_nodes() < 2 or not nx.is_connected(g):
        return 0.0
    relabelled = nx.convert_node_labels_to_integers(g, ordering="sorted")
    return dacct.algebraic_connectivity(relabelled, 0)


def plan_report(cfg: Config, plan, *, source: int | None, method: str) -> dict:
    q, R = plan.collusion, plan.rounds
    try:
        if plan.n <= PAIRWISE_MAX_N:
            sg = dacct.SpectralGraph(plan.graph, collusion=q)
            rho_exact = R * sg.step_rho(plan.sigma, plan.sigma_cor, plan.sensitivity)
        else:
            rho_exact = R * dacct.graph_step_rho(
                plan.graph, plan.sigma, plan.sigma_cor, plan.sensitivity, collusion=q
            )
        a_q = dacct.algebraic_connectivity(plan.graph, q)
    except dacct.TooManyCoalitions as exc:
        raise AuditError(str(exc)) from None
    rho_paper = R * dacct.closed_form_rho(
        plan.n, a_q, plan.sigma, plan.sigma_cor, plan.sensitivity, q
    )
    u = units_of(plan)
    base = {
        "alpha": plan.alpha,
        "delta": plan.delta,
        "method": method,
        "protocol": plan.protocol,
        "n": plan.n,
        "steps": plan.steps,
        "rounds": R,
        "gossip_steps": 1,
        "accelerated": False,
        "spectral_gap": plan.spectral_gap,
        "sigma": plan.sigma,
        "sigma_cor": plan.sigma_cor,
        "collusion": q,
        "sensitivity": plan.sensitivity,
        "ldp": ldp_baseline(plan, method),
        "gamma_w": dacct.gamma_w(plan.W, plan.graph),
        "secldp": secldp_block(plan, rho_exact, rho_paper, a_q),
        "accounting": accounting_note(plan),
    }
    if plan.n > PAIRWISE_MAX_N:
        return {**base, "source": source, "pairwise": None}
    F = plan_pairwise(plan, method, sg if q == 1 else None)
    if source is not None:
        if not 0 <= source < plan.n:
            raise AuditError(f"--source {source} is not a node id (0..{plan.n - 1})")
        dist = graphs.distances_from(plan.graph, source)
        losses = [
            u.method(method)(float(F[v, source])).entry(observer=v, distance=int(dist[v]))
            for v in range(plan.n)
            if v != source
        ]
        return {**base, "source": source, "losses": losses}
    return {**base, "source": None, **summarise(plan, F, method)}


def planned_losses(cfg: Config, plan, observers) -> dict[int, dict]:
    """Observer -> {(source, method): loss} under the fault-free plan (every pair active in
    every round): exactly the pairwise entries of :func:`plan_report`, ``exact`` and ``paper``."""
    u = units_of(plan)
    out: dict[int, dict] = {int(v): {} for v in observers}
    for m in ("exact", "paper"):
        F = _pairwise(plan, m)
        for v, cells in out.items():
            for src in range(plan.n):
                if src != v:
                    cells[(src, m)] = u.method(m)(float(F[v, src])).entry()
    return out


def worst_case_losses(cfg: Config, plan, observers) -> dict[int, dict]:
    """Observer -> {(source, method): loss} for an observer about which nothing is known: every
    entry is the larger of the planned loss and the local-DP loss of the source's releases
    (``ldp`` of the report: R rounds of a Gaussian mechanism at sigma). That is the loss when
    none of the source's correlated terms hides anything (every pair secret of the source known
    to the adversary, or no pair at all): the correlated noise only ever adds to sigma's, so no
    realised set of pairs, drops or colluders can cost the source more in a round (both the
    ``exact`` [Sigma_H^-1]_ii and the closed form are at most Delta^2 / (2 sigma^2))."""
    cap = {m: ldp_baseline(plan, m) for m in ("exact", "paper")}
    return {
        v: {key: loss.at_least(x, cap[key[1]]) for key, x in cells.items()}
        for v, cells in planned_losses(cfg, plan, observers).items()
    }


# ---------------------------------------------------------------------------------------- audit


class RealisedRounds:
    """What the logs say about every round: published nodes, the terms each node added, pairs
    whose two ends used different secrets, and nodes whose record is missing."""

    def __init__(self, n: int, rounds: int):
        self.n, self.rounds = n, rounds
        self.published: list[set[int]] = [set() for _ in range(rounds)]
        self.added: list[dict[int, tuple[int, ...]]] = [{} for _ in range(rounds)]
        self.commits: list[dict[tuple[int, int], str]] = [{} for _ in range(rounds)]
        self.unknown: list[set[int]] = [set() for _ in range(rounds)]
        self.unmatched: list[set[frozenset]] = [set() for _ in range(rounds)]

    def matched(self, r: int) -> list[tuple[int, int]]:
        """Pairs (v < j) whose two ends both added their term with the same secret in round r."""
        return [
            (v, j)
            for v, peers in self.added[r].items()
            for j in peers
            if v < j
            and v in self.added[r].get(j, ())
            and frozenset((v, j)) not in self.unmatched[r]
        ]

    def structure(self, r: int) -> tuple:
        """A hashable summary of round r (equal summaries give equal losses)."""
        return (
            frozenset(self.published[r]),
            tuple(sorted((v, p) for v, p in self.added[r].items() if v in self.published[r])),
            frozenset(self.unmatched[r]),
            frozenset(self.unknown[r]),
        )


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int_list(x) -> list[int] | None:
    """x as a list of ints, or None when it is not one."""
    if not isinstance(x, list | tuple) or not all(_is_int(p) for p in x):
        return None
    return [int(p) for p in x]


def _exchange_ok(plan, v: int, r: dict) -> bool:
    """The condition under which ``scan_exchanges`` uses a send, recv or late record (the records
    it rejects it reports as impossible)."""
    t, w = r.get("step"), r.get("peer")
    return (
        isinstance(t, int) and isinstance(w, int) and 0 <= t < plan.steps
        and w in plan.partners_at(v, t)
    )  # fmt: skip


@dataclass
class _Records:
    """A log's records as ``scan_exchanges`` reads them."""

    records: list[dict]


def _decor_problem(
    plan, v: int, r: dict, pairs: dict[int, str], rounds_seen: set[int]
) -> str | None:
    """What makes one of DECOR's own records impossible for node v (None: nothing).
    ``pairs``: the pairs v's log established so far (peer -> commitment)."""
    k, R = r["k"], plan.rounds
    nbrs = set(plan.neighbours(v))
    if k in ("decor-pair", "decor-no-pair", "decor-drop"):
        peer = r.get("peer")
        if not (_is_int(peer) and peer in nbrs):
            return f"peer {peer!r} is not a neighbour of node {v}"
        if k == "decor-pair":
            if not isinstance(r.get("commit"), str):
                return f"commitment {r.get('commit')!r} is not a string"
            if peer in pairs:
                return f"a second pair with {peer}"
        if k == "decor-drop" and not _is_int(r.get("first_round")):
            return f"first round {r.get('first_round')!r} is not a round number"
        return None
    if k == "decor-exchange":
        got = _int_list(r.get("pairs"))
        if got is None or sorted(got) != sorted(pairs):
            return f"pairs {r.get('pairs')!r} differ from the pairs logged before ({sorted(pairs)})"
        return None
    # decor-noise
    rnd = r.get("round")
    if not (_is_int(rnd) and 0 <= rnd < R):
        return f"round {rnd!r} is not in 0..{R - 1}"
    if rnd in rounds_seen:
        return f"a second record of round {rnd}"
    peers, commits = _int_list(r.get("peers")), r.get("commits")
    if peers is None or len(set(peers)) != len(peers):
        return f"peers {r.get('peers')!r} is not a list of distinct node ids"
    stray = sorted(set(peers) - set(pairs))
    if stray:
        return f"terms of pairs {stray} that the log never established"
    if not (
        isinstance(commits, list | tuple)
        and len(commits) == len(peers)
        and all(isinstance(c, str) for c in commits)
    ):
        return f"commitments {commits!r} do not match the {len(peers)} peer(s)"
    return None


_DECOR_KINDS = ("decor-pair", "decor-no-pair", "decor-exchange", "decor-noise", "decor-drop")


def _usable_records(logs: dict, integrity: list[dict]) -> dict[int, _Records]:
    """Every log's records less the ``recv`` records that name no digest of the value received
    (reported as impossible): a DECOR value is only ever logged by its digest."""
    usable: dict[int, _Records] = {}
    for v, vl in logs.items():
        kept = []
        for rec in vl.records:
            if rec.get("k") == "recv" and not isinstance(rec.get("digest"), str):
                if "value" not in rec or "digest" in rec:
                    integrity.append(
                        {
                            "node": v,
                            "kind": "impossible-record",
                            "message": f"recv record seq {rec.get('seq')!r} has no digest of the "
                            "value received; ignored",
                        }
                    )
                    continue
            kept.append(rec)
        usable[v] = _Records(kept)
    return usable


@dataclass
class _NodePairs:
    """What node v's log established so far, while it is replayed."""

    pairs: dict[int, str] = field(default_factory=dict)  # peer -> commitment
    dropped: dict[int, int] = field(default_factory=dict)  # peer -> first round without it
    rounds_seen: set[int] = field(default_factory=set)


def _replay_decor_record(
    plan,
    v: int,
    rec: dict,
    node: _NodePairs,
    rr: RealisedRounds,
    pair_commits: dict[tuple[int, int], str],
    integrity: list[dict],
) -> None:
    """One of DECOR's own records of node v: checked, then noted in ``node``, ``rr`` and
    ``pair_commits`` (a record with a problem is reported and not used)."""
    k, R = rec["k"], plan.rounds
    problem = _decor_problem(plan, v, rec, node.pairs, node.rounds_seen)
    if problem is None and k == "decor-noise":
        late = [j for j in rec["peers"] if node.dropped.get(j, R) <= rec["round"]]
        if late:
            problem = f"terms of pairs {late} dropped before round {rec['round']}"
    if problem is not None:
        integrity.append(
            {
                "node": v,
                "kind": "impossible-record",
                "message": f"{k} record seq {rec.get('seq')!r}: {problem}; ignored",
            }
        )
        return
    if k == "decor-pair":
        node.pairs[rec["peer"]] = rec["commit"]
        pair_commits[(v, rec["peer"])] = rec["commit"]
    elif k == "decor-drop":
        node.dropped[rec["peer"]] = min(node.dropped.get(rec["peer"], R), rec["first_round"])
    elif k == "decor-noise":
        r = rec["round"]
        node.rounds_seen.add(r)
        peers = tuple(int(p) for p in rec["peers"])
        rr.added[r][v] = peers
        for j, c in zip(peers, rec["commits"], strict=True):
            rr.commits[r][(v, j)] = c


def _replay_node(
    plan,
    v: int,
    records: list[dict],
    rr: RealisedRounds,
    pair_commits: dict[tuple[int, int], str],
    integrity: list[dict],
) -> None:
    """Node v's records in log order: the values it published or received (exchange records
    that ``scan_exchanges`` accepts) and DECOR's own records."""
    node = _NodePairs()
    for rec in records:
        k = rec["k"]
        if k in ("send", "recv", "late"):
            if not _exchange_ok(plan, v, rec) or rec["step"] >= plan.rounds:
                continue
            rr.published[rec["step"]].add(v if k == "send" else rec["peer"])
            continue
        if k not in _DECOR_KINDS:
            continue
        _replay_decor_record(plan, v, rec, node, rr, pair_commits, integrity)


def _check_pair_commits(pair_commits: dict[tuple[int, int], str], integrity: list[dict]) -> None:
    """``pair-commit-mismatch``: the two ends of a pair logged different commitments for the
    secret they established."""
    for (v, j), c in sorted(pair_commits.items()):
        if v < j and (j, v) in pair_commits and pair_commits[(j, v)] != c:
            integrity.append(
                {
                    "node": v,
                    "kind": "pair-commit-mismatch",
                    "message": f"nodes {v} and {j} logged different commitments for the pair "
                    "secret they established: one of the logs is not what its node wrote",
                }
            )


def _unknown_publishers(rr: RealisedRounds, r: int, logs: dict, integrity: list[dict]) -> None:
    """Nodes that published in round r without a usable record of the terms they added: their
    secrets are given away (``missing-record`` for those whose log was read)."""
    for v in sorted(rr.published[r]):
        if v not in rr.added[r]:
            # Published, but we do not know which terms it added: give its secrets away.
            rr.unknown[r].add(v)
            if v in logs:
                integrity.append(
                    {
                        "node": v,
                        "kind": "missing-record",
                        "message": f"round {r}: node {v} sent its value but its log has no "
                        "decor-noise record of the terms it added; counted as a colluder "
                        "in that round",
                    }
                )


def _mismatched_pairs(rr: RealisedRounds, r: int, integrity: list[dict]) -> None:
    """Pairs whose two ends both added their round-r terms under different commitments: both
    ends are given away (``pair-mismatch``)."""
    for v, peers in rr.added[r].items():
        for j in peers:
            if v < j and j in rr.added[r] and v in rr.added[r][j]:
                a, b = rr.commits[r].get((v, j)), rr.commits[r].get((j, v))
                if a != b:
                    # Both ends derive the round's key from the secret they agreed on, so the
                    # commitments differ only if a log is not what its node wrote: the terms
                    # cannot be trusted to cancel or to be secret; give both ends away.
                    rr.unknown[r].update((v, j))
                    integrity.append(
                        {
                            "node": v,
                            "kind": "pair-mismatch",
                            "message": f"round {r}: nodes {v} and {j} logged different "
                            "commitments for their pair; both are counted as colluders in "
                            "that round",
                        }
                    )


def _note_one_sided_terms(rr: RealisedRounds, notes: list[dict]) -> None:
    """A note counting the pair terms a publishing node added whose other end did not (noise
    that did not cancel)."""
    one_sided = sum(
        1
        for r in range(rr.rounds)
        for v, peers in rr.added[r].items()
        for j in peers
        if v in rr.published[r] and not (j in rr.published[r] and v in rr.added[r].get(j, ()))
    )
    if one_sided:
        notes.append(
            {
                "kind": "one-sided-terms",
                "message": f"{one_sided} pair term(s) were added by one end only (a neighbour "
                "gone or a pair dropped mid-run): noise that did not cancel, counted as noise of "
                "that node only",
            }
        )


def replay_rounds(run_dir: Path, plan, integrity: list[dict], notes: list[dict]):
    """What the logs say about every round (:class:`RealisedRounds`), with the integrity checks
    of every step-exchange family (``scan_exchanges``) and DECOR's own: the seed exchange
    (``decor-pair``, ``decor-no-pair``, ``decor-exchange``: neighbours only, one pair per
    neighbour, the two ends' commitments equal), the per-round terms (``decor-noise``: one record
    per round, of established pairs only, not of a pair dropped before) and the drops. A record
    that fails is reported and not used: a node whose round record is unusable is treated as a
    colluder in that round (an upper bound). Never raises on damaged logs."""
    n, R = plan.n, plan.rounds
    rr = RealisedRounds(n, R)
    logs = read_logs(run_dir, plan, integrity)
    usable = _usable_records(logs, integrity)
    # The checks every step-exchange family gets: unfinished logs, impossible records, values
    # received that their sender never logged sending, or logged differently.
    scan_exchanges(usable, plan, integrity)
    pair_commits: dict[tuple[int, int], str] = {}
    for v, vl in usable.items():
        _replay_node(plan, v, vl.records, rr, pair_commits, integrity)
    _check_pair_commits(pair_commits, integrity)
    for r in range(R):
        _unknown_publishers(rr, r, logs, integrity)
        _mismatched_pairs(rr, r, integrity)
    for v in sorted(set(range(n)) - set(logs)):
        for r in range(R):
            rr.unknown[r].add(v)
    _note_one_sided_terms(rr, notes)
    return rr, logs


def _over_rounds(plan, rr: RealisedRounds, coalitions, cache: dict, method: str, round_fn):
    """Per (coalition, node) rho summed over the rounds, shape (len(coalitions), n); 0 where the
    node colludes or did not publish. ``round_fn(r)`` returns ``fill(colluders, row)``, which
    writes round r's rho into ``row``; rounds of equal structure are computed once.

    A node whose terms of a round are unknown (its log missing or damaged) is handed to the
    adversary as a colluder, which can only help the adversary against the others; its own
    value of that round, if published, is then protected by sigma alone, so it is charged the
    local-DP loss of the round (never 0: it did not collude)."""
    out = np.zeros((len(coalitions), plan.n))
    tag = (method, tuple(coalitions))
    ldp_rho = plan.sensitivity**2 / (2.0 * plan.sigma**2)
    for r in range(rr.rounds):
        key = (tag, rr.structure(r))
        if key not in cache:
            per = np.zeros((len(coalitions), plan.n))
            fill = round_fn(r)
            for ci, q in enumerate(coalitions):
                fill(set(q) | rr.unknown[r], per[ci])
                exposed = sorted((rr.unknown[r] & rr.published[r]) - set(q))
                per[ci, exposed] = ldp_rho
            cache[key] = per
        out += cache[key]
    return out


def realised_rho(plan, rr: RealisedRounds, coalitions, cache: dict) -> np.ndarray:
    """``exact``: (Delta^2/2)[Sigma_H^-1]_ii of every realised round (module doc)."""
    half = plan.sensitivity**2 / 2.0

    def round_fn(r: int):
        added = {v: p for v, p in rr.added[r].items() if v in rr.published[r]}
        unmatched = [tuple(p) for p in rr.unmatched[r]]

        def fill(colluders: set, row: np.ndarray) -> None:
            honest, M = dacct.round_matrix(
                plan.n,
                added,
                published=rr.published[r],
                colluders=sorted(colluders),
                unmatched=unmatched,
            )
            if len(honest):
                row[honest] = half * dacct.inverse_diagonal(plan.sigma, plan.sigma_cor, M)

        return fill

    return _over_rounds(plan, rr, coalitions, cache, "exact", round_fn)


def realised_paper_rho(plan, rr: RealisedRounds, coalitions, cache: dict) -> np.ndarray:
    """``paper``: the closed form per round on the realised pair graph (both ends added the term
    with the same secret, both published, both honest); one-sided terms are left out, which only
    removes noise, so this stays an upper bound."""

    def round_fn(r: int):
        pub = rr.published[r]
        g = nx.Graph()
        g.add_nodes_from(pub)
        g.add_edges_from((v, j) for v, j in rr.matched(r) if v in pub and j in pub)

        def fill(colluders: set, row: np.ndarray) -> None:
            honest = sorted(pub - colluders)
            if honest:
                a = _lambda2(g.subgraph(honest))
                row[honest] = dacct.closed_form_rho(
                    len(honest), a, plan.sigma, plan.sigma_cor, plan.sensitivity
                )

        return fill

    return _over_rounds(plan, rr, coalitions, cache, "paper", round_fn)


def audit_run(run_dir: Path, cfg: Config, plan, observers=None) -> dict:
    n = plan.n
    integrity: list[dict] = []
    notes: list[dict] = []
    rr, logs = replay_rounds(run_dir, plan, integrity, notes)
    wanted = sorted(logs) if observers is None else list(observers)
    without_log: list[dict] = []
    for v in wanted:
        if not 0 <= v < n:
            raise AuditError(f"observer {v} is not a node id (0..{n - 1})")
        if v not in logs:
            # The curious user's view is every message, whatever its log says; without the log
            # its terms are unknown, and it is counted as a colluder (as it is anyway).
            without_log.append(
                {
                    "observer": v,
                    "message": f"observer {v} has no readable log: its losses are computed from "
                    "the other logs, its own pair terms counted as known to the adversary",
                }
            )
    fault_free = not integrity and all(
        rr.published[r] == set(range(n))
        and not rr.unknown[r]
        and not rr.unmatched[r]
        and all(set(rr.added[r].get(v, ())) == set(plan.neighbours(v)) for v in range(n))
        for r in range(plan.rounds)
    )
    cache: dict = {}
    try:
        coalitions = dacct.coalitions(n, plan.collusion)
        rho_q = realised_rho(plan, rr, coalitions, cache).max(axis=0)
        paper_q = realised_paper_rho(plan, rr, coalitions, cache).max(axis=0)
        curious = [(v,) for v in range(n)]
        exact_pairs = realised_rho(plan, rr, curious, cache)  # [v, u]
        paper_pairs = realised_paper_rho(plan, rr, curious, cache)
    except dacct.TooManyCoalitions as exc:
        raise AuditError(str(exc)) from None
    u = units_of(plan)
    unit = u.ldp_rho
    dist_all = graphs.all_distances(plan.graph)
    out_obs = []
    for v in wanted:
        losses = []
        for src in range(n):
            if src == v:
                continue
            for m, F in (("exact", exact_pairs), ("paper", paper_pairs)):
                f = float(F[v, src]) / unit
                losses.append(
                    u.method(m)(f).entry(source=src, method=m, distance=int(dist_all[v, src]))
                )
        out_obs.append({"observer": v, "losses": losses})
    a_q = dacct.algebraic_connectivity(plan.graph, plan.collusion)
    block = secldp_block(plan, rho_q, float(paper_q.max()), a_q)
    block["realised_pairs"] = _pair_summary(rr)
    return {
        **audit_head(run_dir, cfg.protocol.name, plan, steps=plan.steps, fault_free=fault_free),
        "ldp": ldp_baseline(plan),
        "accounting": accounting_note(plan),
        "secldp": block,
        "observers": out_obs,
        "complete": not integrity,
        "integrity": integrity,
        "observers_without_log": without_log,
        "notes": notes,
    }


def _pair_summary(rr: RealisedRounds) -> dict:
    """How many pair terms cancelled, per round (min/max) and in total."""
    counts = [len(rr.matched(r)) for r in range(rr.rounds)]
    return {
        "matched_pairs_min": int(min(counts)) if counts else 0,
        "matched_pairs_max": int(max(counts)) if counts else 0,
        "matched_pair_rounds": int(sum(counts)),
    }


# ------------------------------------------------------------------------------------ calibrate


def calibrate(cfg: Config, target_eps: float, *, which: str = "mid", grid: int = 50) -> dict:
    """(sigma, sigma_cor) pairs whose SecLDP loss at the configured collusion level meets
    target_eps (the paper's search, App. D.1), and the chosen one."""
    import dataclasses

    from coordinator_free.families.learning.protocol import make_plan

    plan = make_plan(cfg)
    q = plan.collusion
    if plan.n > PAIRWISE_MAX_N:
        raise AuditError(f"decor calibration is limited to n <= {PAIRWISE_MAX_N} nodes")
    try:
        sg = dacct.SpectralGraph(plan.graph, collusion=q)
    except dacct.TooManyCoalitions as exc:
        raise AuditError(str(exc)) from None
    sens = plan.sensitivity
    cal = dacct.calibrate_pairs(
        lambda a, b: sg.worst_step_rho(a, b, sens),
        rounds=plan.rounds,
        target_eps=target_eps,
        delta=plan.delta,
        sensitivity=sens,
        honest_n=plan.n - q,
        grid=grid,
        gaussian=True,  # the exact column: the Gaussian profile of the worst user's view
    )
    chosen = dacct.choose_pair(cal, which)
    c = dataclasses.replace(
        cfg,
        privacy=dataclasses.replace(
            cfg.privacy, sigma=chosen["sigma_cdp"], sigma_cor=chosen["sigma_cor"]
        ),
    )
    check = plan_report(c, make_plan(c), source=None, method="exact")
    return {
        "protocol": cfg.protocol.name,
        "method": "exact",
        "budget": f"secldp (collusion {q})",
        "target_eps": target_eps,
        "delta": plan.delta,
        "sigma": chosen["sigma_cdp"],
        "sigma_cor": chosen["sigma_cor"],
        "choice": which,
        "sensitivity": sens,
        "steps": plan.steps,
        "rounds": plan.rounds,
        "eps": check["secldp"]["exact"]["eps"],
        "eps_paper_conversion": check["secldp"]["exact"]["eps_paper"],
        "sigma_ldp": cal["sigma_ldp"],
        "sigma_cdp_floor": cal["sigma_cdp_floor"],
        "pairs": cal["pairs"],
        "low": cal["low"],
        "mid": cal["mid"],
        "high": cal["high"],
        "secldp": check["secldp"],
        "worst_pair": check.get("worst_pair"),
        "mean_over_pairs": check.get("mean_over_pairs"),
        "ldp": check["ldp"],
        "accounting": check["accounting"],
    }


# ------------------------------------------------------------------------------- coalitions

COALITION_MODEL = (
    "the coalition sees every message and knows the pair secrets of every edge touching a "
    "member (DECOR's collusion model, privacy.collusion = |coalition| for this one coalition)"
)


def _coalition_rho(plan, members: list[int]) -> np.ndarray:
    """Per-node rho over the fault-free run against this coalition: R (Delta^2/2)
    [(sigma^2 I + sigma_cor^2 L(G[V \\ Q]))^-1]_ii; 0 for the members."""
    added = {v: list(plan.neighbours(v)) for v in range(plan.n)}
    honest, M = dacct.round_matrix(plan.n, added, colluders=members)
    rho = np.zeros(plan.n)
    if len(honest):
        half = plan.sensitivity**2 / 2.0
        rho[honest] = half * dacct.inverse_diagonal(plan.sigma, plan.sigma_cor, M)
    return plan.rounds * rho


def coalition_plan(cfg: Config, plan, observers) -> dict:
    """``cfree plan --observers``: every other user's exact SecLDP loss against this coalition,
    in units of one round of local DP (the pairwise table's units)."""
    from coordinator_free.accounting.coalition import members_of, report

    members = members_of(observers, plan.n)
    f = _coalition_rho(plan, members) / units_of(plan).ldp_rho
    rep = report(cfg, plan, members, f, ldp_factor=float(plan.rounds))
    rep.update(sigma_cor=plan.sigma_cor, model=COALITION_MODEL, notes=[])
    return rep


def coalition_audit(run_dir: Path, cfg: Config, plan, observers) -> dict:
    """``cfree audit --observers``: the same for the rounds the logs show (a node whose terms
    of a round are unknown is handed to the coalition, as in the full audit); floored at the
    plan when any log is damaged or missing."""
    from coordinator_free.accounting.coalition import members_of, report

    members = members_of(observers, plan.n)
    integrity: list[dict] = []
    notes: list[dict] = []
    rr, _logs = replay_rounds(run_dir, plan, integrity, notes)
    unit = units_of(plan).ldp_rho
    f = realised_rho(plan, rr, [tuple(members)], {})[0] / unit
    basis = "logs"
    if integrity:
        planned = _coalition_rho(plan, members) / unit
        if np.any(planned > f + 1e-12):
            basis = "logs, floored at the plan"
        f = np.maximum(f, planned)
    rep = report(cfg, plan, members, f, ldp_factor=float(plan.rounds))
    fault_free = not integrity and all(
        rr.published[r] == set(range(plan.n)) and not rr.unknown[r] and not rr.unmatched[r]
        for r in range(plan.rounds)
    )
    rep.update(
        sigma_cor=plan.sigma_cor,
        model=COALITION_MODEL,
        run_dir=str(run_dir),
        fault_free=fault_free,
        complete=not integrity,
        basis=basis,
        integrity=integrity,
        notes=notes,
    )
    return rep
