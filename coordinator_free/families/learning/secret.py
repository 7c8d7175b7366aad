"""Secret per-round graphs (``graph.hidden``): every round a fresh Erdős–Rényi graph that each
node knows only around itself.

Every pair {u, v} shares a secret (X25519 of one node's private key and the other's public key
from the roster, through HKDF with the run id: ``seeds.NodeSecretStreams.pair_secret``); the
edge is in round r's graph when ``HKDF(secret, r)``, read as a number in [0, 1), is below
``graph.p``. Both ends compute the same bit, nobody else can: a node knows its own neighbours of
every round and nothing of the other edges. The weights are ``protocol.weights = "lazy"``,
``W_uv = 1/n`` on an edge and the rest on the diagonal, which a node computes from its own
degree alone. A round's graph may be disconnected (nobody can check or redraw it); rounds
with fresh graphs still mix.

Who knows which graphs:

* a peer: its own neighbours (:func:`bind_node`; its plan refuses to answer for another node);
* the simulator: every graph, from every node's streams (:func:`bind_all`: the run's keys with
  ``cfree simulate --run``, the public seed otherwise);
* the auditor: every graph, from the view logs, where each node records its neighbours of every
  round (``secret-partners``) (:func:`bind_logged`). The audit's exact loss is then conditional
  on the graphs, as if the observer knew them, which it does not: an upper bound on what an
  observer learns, not the amplification the secrecy buys (Theorem 4/9 of the Muffliato paper,
  which the plan states: per pair its worst case is R-fold local DP, since any pair may be an
  edge in every round; its expectation over the graphs is reported as such, at the orders its
  condition on sigma allows, ``coordinator_free.privacy.private_graph``).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable

import networkx as nx
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from coordinator_free import graphs
from coordinator_free.privacy import private_graph

_EDGE_INFO = b"coordinator-free/v1 secret graph edge"
#: The view-log record of a node's neighbours in one round of a secret graph.
RECORD = "secret-partners"


def edge_draw(secret: bytes, r: int) -> float:
    """The pair's uniform number in [0, 1) for round r (53 bits, exactly representable)."""
    okm = HKDF(
        algorithm=hashes.SHA256(), length=8, salt=None, info=_EDGE_INFO + struct.pack(">Q", r)
    ).derive(secret)
    return (int.from_bytes(okm, "big") >> 11) / float(1 << 53)


def partners(v: int, n: int, p: float, r: int, secret: Callable[[int], bytes]) -> list[int]:
    """Node v's neighbours in round r, from its pair secrets (``secret(w)``)."""
    return [w for w in range(n) if w != v and edge_draw(secret(w), r) < p]


def _bind(plan, edges: list[list[tuple[int, int]]], node: int | None):
    rounds_g, rounds_w = [], []
    for es in edges:
        g = nx.Graph()
        g.add_nodes_from(range(plan.n))
        g.add_edges_from(es)
        rounds_g.append(g)
        rounds_w.append(graphs.gossip_matrix(g, "lazy"))
    return dataclasses.replace(
        plan, round_graphs=tuple(rounds_g), round_W=tuple(rounds_w), bound_node=node
    )


def bind_node(plan, v: int, streams):
    """Node v's plan: its own neighbours of every round (the other edges unknown). ``streams``:
    v's (:meth:`pair_secret`)."""
    edges = [
        [(v, w) for w in partners(v, plan.n, plan.secret_p, r, streams.pair_secret)]
        for r in range(plan.rounds)
    ]
    return _bind(plan, edges, v)


def bind_all(plan, streams):
    """The whole plan from every node's streams (``streams.node(v).pair_secret``)."""
    n = plan.n
    draws = {}
    for a in range(n):
        own = streams.node(a)
        for b in range(a + 1, n):
            draws[(a, b)] = own.pair_secret(b)
    edges = [
        [(a, b) for (a, b), s in draws.items() if edge_draw(s, r) < plan.secret_p]
        for r in range(plan.rounds)
    ]
    return _bind(plan, edges, None)


def bind_logged(plan, logs: dict) -> tuple[object, list[dict]]:
    """The plan with the graphs the view logs show: node v's ``secret-partners`` record of round
    r lists its neighbours; an edge is in when either end lists it (a node without a log, or
    without the record, is known through its neighbours' records). Returns the plan and the
    integrity findings (a malformed record, the two ends disagreeing about an edge)."""
    claims: dict[tuple[int, int, int], set[int]] = {}
    problems: list[dict] = []
    for v, log in logs.items():
        for rec in log.records:
            if rec.get("k") != RECORD:
                continue
            try:
                r = int(rec["round"])
                peers = [int(w) for w in rec["peers"]]
                ok = 0 <= r < plan.rounds and all(0 <= w < plan.n and w != v for w in peers)
            except (KeyError, TypeError, ValueError):
                ok = False
            if not ok:
                problems.append(
                    {"node": v, "kind": "bad-record", "message": f"malformed {RECORD} record"}
                )
                continue
            for w in peers:
                claims.setdefault((r, min(v, w), max(v, w)), set()).add(v)
    edges: list[list[tuple[int, int]]] = [[] for _ in range(plan.rounds)]
    for (r, lo, hi), who in sorted(claims.items()):
        edges[r].append((lo, hi))
        if lo in logs and hi in logs and who != {lo, hi}:
            problems.append(
                {
                    "node": min(who),
                    "kind": "edge-disagreement",
                    "message": f"round {r}: only node {min(who)} lists the edge {lo}-{hi} in "
                    f"its {RECORD} record",
                }
            )
    return _bind(plan, edges, None), problems


def expected_degree(plan) -> float:
    return (plan.n - 1) * plan.secret_p


def theorem_factor(plan) -> float:
    """Theorem 4/9 of the Muffliato paper per round for a pair that is not an edge, in units
    of local DP: ``E[min(1, 2 K d / (n - d))]`` over the observer's degree d ~ Bin(n - 2, p)
    (an expectation: a pair that is an edge in a round loses local DP that round)."""
    return private_graph.expected_non_adjacent_factor(plan.n, plan.secret_p, plan.gossip_steps)


def expected_factor(plan) -> float:
    """The theorem's expectation over the graphs of the R-round factor (not a per-pair bound:
    a pair may be an edge in every round, see :func:`worst_case_factor`)."""
    return private_graph.expected_factor(plan.n, plan.secret_p, plan.gossip_steps, plan.rounds)


def worst_case_factor(plan) -> float:
    """The theorem's per-pair worst case: an edge in every round, R-fold local DP."""
    return private_graph.worst_case_factor(plan.rounds)


def theorem_alpha_max(plan) -> float:
    """The largest Rényi order at which the theorem holds (its condition on sigma)."""
    return private_graph.alpha_max(plan.sigma, plan.sensitivity)


def theorem_condition(plan) -> bool:
    """The theorem's condition sigma^2 >= Delta^2 alpha (alpha - 1) / 2 at the plan's order."""
    return private_graph.condition_holds(plan.alpha, plan.sigma, plan.sensitivity)
