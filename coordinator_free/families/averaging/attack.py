"""What a coalition of curious nodes reconstructs from its view logs in gossip averaging.

The attack of the thesis' Chapter 4 (Alg. 4.1), on Muffliato averaging: every value a coalition
member received at step t from node x is ``C_t[x, :] y``, where y holds every node's noisy input
(``x_v + eta_v``; with no noise, the private values themselves) and ``C_t`` is the public
schedule's coefficient matrix (``C_0 = I``, ``C_1 = W``, Chebyshev recursion after). Stacking the
members' own inputs (``e_a``) and every received row gives the *knowledge matrix* K with
``K y = Y``, Y the values the members hold. Node u is reconstructible exactly when ``e_u`` lies in
the row space of K; its value is then ``y_u``, read from any solution of ``K y = Y``.

Reconstructibility is decided on the exact knowledge matrix (rational weights, fraction-free
row reduction to reduced row echelon form), so it needs no tolerance. The values come from the
minimum-norm least-squares solution in floating point: any two solutions differ by a vector of
the null space of K, which is orthogonal to ``e_u`` for a reconstructible u, so the
least-squares ``y_u`` is the true one up to rounding.

Only public parameters (the config, hence W and the schedule) and the coalition's own records
enter: received values from the members' view logs, and the members' own inputs, which a
member knows and a view log never holds (rebuilt from the members' keys when the run directory
has them; otherwise the attack runs without them, and says so). Assumes the fault-free
schedule: a member's log that shows a missed or late value is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from coordinator_free import rundir
from coordinator_free.accounting.render import table
from coordinator_free.errors import CfreeError
from coordinator_free.privacy import muffliato as acct


class AttackError(CfreeError, ValueError):
    """The attack cannot run on this input (named)."""


@dataclass
class Knowledge:
    """The coalition's knowledge matrix and what it observed."""

    members: list[int]
    rows: list[tuple[str, int, int]]  # ("own", a, 0) or ("recv", x, t), one per row of K
    exact: list[list[int]]  # integer rows (row i of K = exact[i] / den[i])
    dens: list[int]
    values: np.ndarray  # Y, shape (len(rows), dim)
    notes: list[str] = field(default_factory=list)

    @property
    def matrix(self) -> np.ndarray:
        """K in floating point."""
        return np.array(
            [[c / d for c in row] for row, d in zip(self.exact, self.dens, strict=True)],
            dtype=np.float64,
        )


def knowledge(plan, members, received, own_values=None) -> Knowledge:
    """The knowledge matrix of a coalition.

    ``received``: ``{(t, x): value}`` the coalition got (value of sender x at step t);
    ``own_values``: ``{a: y_a}`` for the members whose own input is known (may be empty)."""
    members = sorted(set(members))
    steps = acct.fault_free_steps(plan.W, plan.steps, plan.accelerated, plan.gamma)
    msgs = sorted(received)
    last = max((t for t, _ in msgs), default=0)
    rows, exact, dens, vals = [], [], [], []
    n = plan.n
    for a in sorted(own_values or {}):
        unit = [0] * n
        unit[a] = 1
        rows.append(("own", a, 0))
        exact.append(unit)
        dens.append(1)
        vals.append(np.asarray(own_values[a], dtype=np.float64))
    by_t: dict[int, list[int]] = {}
    for t, x in msgs:
        by_t.setdefault(t, []).append(x)
    for t, cur, den in acct.exact_coefficients(steps, last):
        for x in by_t.get(t, []):
            rows.append(("recv", x, t))
            exact.append(list(cur[x]))
            dens.append(den)
            vals.append(np.asarray(received[(t, x)], dtype=np.float64))
    values = np.stack(vals) if vals else np.zeros((0, plan.dim))
    return Knowledge(members, rows, exact, dens, values)


def rref(rows: list[list[int]]) -> list[tuple[int, list[int]]]:
    """Reduced row echelon form of integer rows, exactly: ``(pivot, row)`` pairs, each row zero
    at every other pivot (fraction-free; divide by ``row[pivot]`` for the unit pivot)."""
    basis: list[tuple[int, list[int]]] = []
    for r in rows:
        g = 0
        for c in r:
            g = math.gcd(g, c)
        basis = acct._reduce_into(basis, [c // g for c in r] if g > 1 else list(r))
    return basis


def reconstructible(k: Knowledge, n: int) -> list[int]:
    """The nodes u whose e_u lies in the row space of K (exact): pivot rows of the reduced
    echelon form with no other non-zero entry."""
    return sorted(p for p, row in rref(k.exact) if sum(1 for c in row if c) == 1)


def reconstruct(k: Knowledge, n: int) -> dict:
    """``{"reconstructible": [u...], "values": {u: y_u}, "rank": r}``."""
    found = reconstructible(k, n)
    vals: dict[int, np.ndarray] = {}
    if found:
        sol, *_ = np.linalg.lstsq(k.matrix, k.values, rcond=None)
        vals = {u: sol[u] for u in found}
    return {"reconstructible": found, "values": vals, "rank": len(rref(k.exact))}


def check_run(run_dir: Path, cfg, plan) -> None:
    """Refuse a run this attack does not model (anything but synchronous averaging on one
    fixed graph without dropout)."""
    if cfg.protocol.name != "muffliato" or getattr(plan, "dropped", ()) or cfg.graph.resample:
        raise AttackError(
            f"{run_dir}: coalitions and attacks are modelled for gossip averaging on a fixed "
            "graph (protocol muffliato without dropout or resampling) so far; this is "
            f"{cfg.protocol.name}"
        )


def from_logs(run_dir: Path, cfg, plan, members: list[int], logs: dict) -> dict:
    """``{(t, x): value}`` from the members' view logs (``logs``: member -> read view log)."""
    received: dict[tuple[int, int], np.ndarray] = {}
    for a in members:
        log = logs[a]
        where = f"{run_dir}/logs/node-{a}.vlog"
        late = [r for r in log.records if r.get("k") in ("miss", "late")]
        if late:
            raise AttackError(
                f"{where}: node {a} missed or got late values ({len(late)} records); the attack "
                "assumes the fault-free schedule"
            )
        for rec in log.records:
            if rec.get("k") != "recv":
                continue
            if "value" not in rec:
                raise AttackError(
                    f"{where}: recv records hold no values (the run had log.values = false)"
                )
            t, x = int(rec["step"]), int(rec["peer"])
            if not (0 <= t < plan.steps and 0 <= x < plan.n):
                raise AttackError(f"{where}: seq {rec.get('seq')}: message ({t}, {x}) out of range")
            received[(t, x)] = np.asarray(rec["value"], dtype=np.float64)
    return received


def _own_inputs(run_dir: Path, cfg, ids: list[int], n: int):
    """``(inputs, streams)``: the members' own noisy inputs from their keys (None without keys),
    and the run's streams (None unless every key is there, for the comparison with the truth)."""
    from coordinator_free import seeds
    from coordinator_free.families.averaging import node

    if not rundir.roster_path(run_dir).is_file():
        return None, None
    try:
        streams = seeds.streams_of_run(run_dir, n)
        own = {a: node.start_value(cfg, a, streams.node(a)) for a in ids}
    except (OSError, seeds.StreamsError):
        return None, None
    try:
        for u in range(n):
            streams.node(u).stream(0, u)
    except (OSError, seeds.StreamsError, AttributeError):
        return own, None
    return own, streams


def run(run_dir: Path, cfg, plan, ids: list[int], logs: dict) -> dict:
    """`cfree attack` on a Muffliato run: the knowledge matrix of the coalition's logs, its
    exact reconstruction, and (where every key is there) the error against the truth."""
    import networkx as nx

    from coordinator_free.families.averaging import node

    check_run(run_dir, cfg, plan)
    n = plan.n
    received = from_logs(run_dir, cfg, plan, ids, logs)
    own, streams = _own_inputs(run_dir, cfg, ids, n)
    k = knowledge(plan, ids, received, own)
    out = reconstruct(k, n)
    from coordinator_free.families.averaging import coalition

    notes: list = []  # an exact factor that is an upper bound says so here
    factors = coalition.fault_free_factors(plan, list(ids), notes)
    hops = nx.multi_source_dijkstra_path_length(plan.graph, set(ids))
    nodes = []
    for u in range(n):
        if u in ids:
            continue
        row = {
            "node": u,
            "distance": int(hops.get(u, -1)),
            "reconstructed": u in out["values"],
            "factor": float(factors[u]),
            "error": None,
            # As an estimate of the private value x_u the reconstruction is the noisy input:
            # unbiased, standard deviation sigma per coordinate (GLS with covariance sigma^2 I).
            "std": float(plan.sigma) if u in out["values"] else None,
        }
        if u in out["values"]:
            row["value"] = out["values"][u].tolist()
            if streams is not None:
                truth = node.start_value(cfg, u, streams.node(u))
                row["error"] = float(np.max(np.abs(out["values"][u] - truth)))
        nodes.append(row)
    result = {
        "run_dir": str(run_dir),
        "attackers": ids,
        "sigma": cfg.privacy.sigma,
        "steps": plan.steps,
        "n": n,
        "own_inputs": own is not None,
        "rank": out["rank"],
        "messages": len(received),
        "nodes": nodes,
    }
    if notes:
        result["notes"] = notes
    return result


def print_result(res: dict) -> None:
    n = res["n"]
    ids = res["attackers"]
    got = [r for r in res["nodes"] if r["reconstructed"]]
    print(
        f"coalition {ids}: {res['messages']} messages received over {res['steps']} steps; "
        f"knowledge matrix rank {res['rank']} of {n}"
    )
    if not res["own_inputs"]:
        print(
            "  (the attackers' own inputs are unknown here: no keys in the run directory; the "
            "attack used the received values only)"
        )
    rows = []
    for r in res["nodes"]:
        err = "" if r["error"] is None else f"{r['error']:.2e}"
        yes = "yes" if r["reconstructed"] else "no"
        rows.append([str(r["node"]), str(r["distance"]), yes, f"{r['factor']:.4f}", err])
    print(table(["node", "dist", "reconstructed", "exact factor", "max |error|"], rows))
    for note in res.get("notes", ()):
        print(f"note: {note['message']}")
    what = (
        "their private value x itself is known to the coalition (sigma = 0: plain gossip, NO "
        "PRIVACY)"
        if res["sigma"] == 0
        else f"their noisy input x + N(0, {res['sigma']:g}^2) is known to the coalition, an "
        f"unbiased estimate of x with standard deviation {res['sigma']:g} per coordinate"
    )
    others = n - len(ids)
    rest = (
        f" What it saw does not determine the other {others - len(got)} (exact factor below 1)."
        if len(got) < others
        else " Every other node is determined: no one is amplified against this coalition."
    )
    print(
        f"{len(got)} of {others} other nodes reconstructed: {what} (exact factor 1: the "
        f"loss equals local DP, nothing is amplified).{rest}"
    )
