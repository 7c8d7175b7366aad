"""What a coalition of curious nodes reconstructs from its view logs in gradient descent over gossip
(D-SGD, Muffliato-GD): every node's gradient, then, for a node holding one example, the example
itself (the attack of the thesis' Chapter 4, Sec. 4.4).

Every model a member received is ``theta^0 - nu * C z``: ``theta^0`` the public start, nu the
step size, z every node's noisy clipped gradients of every round (``z^s_u = g^s_u + eta^s_u``) and
C the public schedule's coefficients (K gossip steps a round, Chebyshev if accelerated; the
linear model of docs/privacy.md section 8). The attack assumes the thesis' Assumption 4.7: each
node's gradient is the same every round up to noise, ``z^s_u = gbar_u + N^s_u``. Then the
scaled observations ``(theta^0 - y) / nu = K gbar + C N`` with ``K[:, u] = sum_s C[:, (s, u)]``
(the thesis' Algorithm 4.2 is this K for one gossip step a round), and

* ``gbar`` is estimated by generalized least squares with the noise covariance
  ``Sigma = sigma^2 C C^T`` (Eq. 4.8, with sigma the run's noise), or by ordinary least squares
  at sigma = 0 (Remark 4.10); a node is *identifiable* when ``e_u`` lies in the row space of K
  (its estimate does not depend on the others'), and its standard deviation under the model is
  ``sigma sqrt([(K^T Sigma^-1 K)^-1]_uu)``;
* for the linear models with an intercept (logistic, least squares) every gradient of a single
  example ``x~ = [x, 1]`` is a multiple of ``x~``, and so is any combination of them, so
  ``x = gbar[:-1] / gbar[-1]`` (the closed-form inversion of a one-example gradient).

Only public parameters (the config, hence W, the schedule, nu and theta^0) and what the members
know enter: the models they received (their logs) and their own noisy gradients of every round,
which each member recomputes from its own shard, its own noise (its key) and what it received,
checked against the digests of what its log says it sent; their part of every observation is
subtracted (the thesis' Algorithm 4.3). Without a member's key its gradients are estimated like
everyone else's. The truth the reconstructions are compared with (the node's example, from the
run's public config) is used for that comparison only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coordinator_free.families.averaging.attack import AttackError, from_logs
from coordinator_free.families.learning import protocol as lp
from coordinator_free.privacy import muffliato as acct

#: Directions of K below this fraction of its largest singular value are not used: on a path
#: the weights of far nodes decay geometrically (Metropolis: 1/3 per hop), and the directions
#: below it are within float64 rounding of the messages (K's condition number reaches 1e17 on a
#: 31-node path). A node is identifiable when e_u lies in the span that is kept. (On the path of
#: docs/results.md, 1e-13 reaches distance 12 and 1e-9 distance 8.)
RCOND = 1e-13

#: Gradient-inversion models: the gradient of one example is a scalar times [x, 1].
INVERTIBLE = ("logistic", "least_squares", "ridge")


def check_run(run_dir: Path, cfg, plan) -> None:
    if not plan.decentralized or cfg.protocol.name not in ("dsgd", "muffliato-gd"):
        raise AttackError(
            f"{run_dir}: the gradient attack covers dsgd and muffliato-gd; this is "
            f"{cfg.protocol.name}"
        )
    if plan.time_varying or getattr(plan, "dropped", ()):
        raise AttackError(
            f"{run_dir}: the gradient attack assumes one fixed graph and the fault-free schedule "
            "(no graph.resample, no dropout)"
        )
    if cfg.model.l2:
        raise AttackError(f"{run_dir}: model.l2 = {cfg.model.l2}: the attack models l2 = 0")


def coefficients(plan, keys: list[tuple[int, int]]) -> np.ndarray:
    """C: one row per received message ``(t, x)`` (t = r K + k), over the R n gradient noises
    ``z^s_u`` (column ``s n + u``), for the fault-free schedule."""
    n, R, K = plan.n, plan.rounds, plan.gossip_steps
    steps = acct.fault_free_steps(plan.W, K, plan.accelerated, plan.gamma)
    want: dict[int, list[int]] = {}
    for row, (t, _x) in enumerate(keys):
        want.setdefault(t, []).append(row)
    out = np.zeros((len(keys), R * n))
    h = np.zeros((n, R * n))
    h[:, :n] = np.eye(n)
    for r in range(R):
        cs = [h]
        for k, (m, g) in enumerate(steps):
            nxt = m @ cs[-1]
            if k >= 1 and g != 1.0:
                nxt = g * nxt + (1.0 - g) * cs[-2]
            cs.append(nxt)
        for k in range(K):
            for row in want.get(r * K + k, ()):
                out[row] = cs[k][keys[row][1]]
        h = cs[K].copy()
        if r + 1 < R:
            h[:, (r + 1) * n : (r + 2) * n] += np.eye(n)
    return out


def estimate(
    plan,
    received: dict[tuple[int, int], np.ndarray],
    theta0: np.ndarray,
    known: dict[int, list[np.ndarray]] | None = None,
) -> dict:
    """``{"identifiable": [u...], "gradients": (n, dim), "std": (n,) or None, "method"}``.

    ``known``: member -> its noisy gradients of every round ``z^s_a``, which it knows; their
    part of every observation is subtracted and they are not estimated (the thesis'
    Algorithm 4.3). The other nodes' gradients are the unknowns."""
    keys = sorted(received)
    if not keys:
        raise AttackError("the coalition received no models")
    n, R = plan.n, plan.rounds
    known = known or {}
    c = coefficients(plan, keys)
    y = np.stack([(theta0 - received[key]) / plan.step_size for key in keys])
    cols = c.reshape(len(keys), R, n)
    for a, zs in known.items():
        y = y - cols[:, :, a] @ np.stack(zs)
    unknown = [u for u in range(n) if u not in known]
    k_mat = cols[:, :, unknown].sum(axis=1)
    c_t = cols[:, :, unknown].reshape(len(keys), -1)
    _, s, vt = np.linalg.svd(k_mat, full_matrices=False)
    basis = vt[s > RCOND * s[0]] if s.size and s[0] > 0 else vt[:0]
    proj = np.einsum("ij,ij->j", basis, basis)  # [P_rowspace(K)]_uu
    identifiable = [u for j, u in enumerate(unknown) if proj[j] > 1 - 1e-8]
    g = np.zeros((n, y.shape[1]))
    std = None
    if plan.sigma > 0:
        sigma_mat = c_t @ c_t.T
        sigma_mat += 1e-12 * max(float(np.trace(sigma_mat)) / len(keys), 1e-300) * np.eye(len(keys))
        chol = np.linalg.cholesky(sigma_mat)
        kw = np.linalg.solve(chol, k_mat)
        yw = np.linalg.solve(chol, y)
        g[unknown], *_ = np.linalg.lstsq(kw, yw, rcond=RCOND)
        cov = np.linalg.pinv(kw.T @ kw, hermitian=True)
        std = np.zeros(n)
        std[unknown] = plan.sigma * np.sqrt(np.clip(np.diag(cov), 0.0, None))
        method = "gls"
    else:
        g[unknown], *_ = np.linalg.lstsq(k_mat, y, rcond=RCOND)
        method = "ols"
    return {"identifiable": identifiable, "gradients": g, "std": std, "method": method}


def own_values(plan, task, a: int, received: dict, streams):
    """``(models, gradients)``: member a's own models ``x^{r,k}_a`` at every step and its noisy
    gradients ``z^r_a`` of every round, recomputed as the member knows them: its local steps on
    its own shard with its own noise (``streams``: the member's, from its key), and the gossip
    with the values it received (a neighbour's missing value: its own, as the node program
    does)."""
    from coordinator_free.families.averaging import protocol as mf

    K = plan.gossip_steps
    theta = task.model.init()
    row = plan.row_at(a, 0)
    out: dict[tuple[int, int], np.ndarray] = {}
    zs: list[np.ndarray] = []
    for r in range(plan.rounds):
        current = lp.local_step(plan, task, a, r, theta, streams)
        zs.append((theta - current) / plan.step_size)
        previous = None
        for k in range(K):
            t = r * K + k
            out[(t, a)] = current
            got = {w: received[(t, w)] for w in row if w != a and (t, w) in received}
            nxt = mf.gossip_update(mf.step_terms(row, a, current, got), plan.gamma_at(t), previous)
            previous, current = current, nxt
        theta = current
    return out, zs


def check_own(log, a: int, own: dict) -> bool:
    """Whether the recomputed own models match the digests of what member a's log says it sent
    (``send`` records)."""
    from coordinator_free.viewlog import digest_like

    sends = [r for r in log.records if r.get("k") == "send" and "digest" in r]
    return bool(sends) and all(
        isinstance(r["digest"], str)
        and (int(r["step"]), a) in own
        and digest_like(own[(int(r["step"]), a)], r["digest"]) == r["digest"]
        for r in sends
    )


def invert(gradient: np.ndarray) -> np.ndarray | None:
    """The example x of a one-example gradient of a linear model with intercept (last
    coordinate): ``gradient[:-1] / gradient[-1]``; None when the intercept part is 0."""
    if gradient[-1] == 0:
        return None
    return gradient[:-1] / gradient[-1]


def member_streams(run_dir: Path, n: int, ids: list[int]) -> dict:
    """The members' own streams from their keys in the run directory ({} without keys)."""
    from coordinator_free import rundir, seeds

    if not rundir.roster_path(run_dir).is_file():
        return {}
    try:
        streams = seeds.streams_of_run(run_dir, n)
        return {a: streams.node(a) for a in ids}
    except (OSError, seeds.StreamsError):
        return {}


def run(run_dir: Path, cfg, plan, ids: list[int], logs: dict, streams: dict | None = None) -> dict:
    """`cfree attack` on a D-SGD / Muffliato-GD run (module doc). ``streams``: the members' own
    streams (default: from their keys in the run directory), to recompute the models they sent,
    which their logs hold only as digests; a member whose recomputation does not match those
    digests is left out of that step."""
    import networkx as nx

    check_run(run_dir, cfg, plan)
    received = from_logs(run_dir, cfg, plan, ids, logs)
    task = lp.make_task(cfg, plan.n)
    theta0 = task.model.init()
    streams = member_streams(run_dir, plan.n, ids) if streams is None else streams
    known = {}
    for a in ids:
        if a not in streams:
            continue
        own, zs = own_values(plan, task, a, received, streams[a])
        if check_own(logs[a], a, own):
            known[a] = zs
    own_used = sorted(known)
    est = estimate(plan, received, theta0, known)
    single = cfg.data.partition == "fixed" and cfg.data.per_node == 1
    can_invert = single and task.model.kind in INVERTIBLE and cfg.data.intercept
    hops = nx.multi_source_dijkstra_path_length(plan.graph, set(ids))
    nodes = []
    for u in range(plan.n):
        if u in ids:
            continue
        g = est["gradients"][u]
        row = {
            "node": u,
            "distance": int(hops.get(u, -1)),
            "reconstructed": u in est["identifiable"],
            "gradient": g.tolist(),
            # The spread under the model, for the nodes the view determines.
            "std": None
            if est["std"] is None or u not in est["identifiable"]
            else float(est["std"][u]),
            "error": None,
        }
        if can_invert:
            x_hat = invert(g)
            truth = task.shard(u)[0][0, :-1]
            row["example"] = None if x_hat is None else x_hat.tolist()
            if x_hat is not None:
                row["error"] = float(np.linalg.norm(x_hat - truth) / np.linalg.norm(truth))
                row["cosine"] = float(
                    x_hat @ truth / (np.linalg.norm(x_hat) * np.linalg.norm(truth))
                )
        nodes.append(row)
    return {
        "run_dir": str(run_dir),
        "protocol": cfg.protocol.name,
        "attackers": ids,
        "sigma": cfg.privacy.sigma,
        "n": plan.n,
        "rounds": plan.rounds,
        "gossip_steps": plan.gossip_steps,
        "messages": len(received),
        "own_models": own_used,
        "method": est["method"],
        "inversion": can_invert,
        "nodes": nodes,
    }


def print_result(res: dict) -> None:
    from coordinator_free.accounting.render import table

    ids = res["attackers"]
    print(
        f"coalition {ids}: {res['messages']} models received over {res['rounds']} rounds of "
        f"{res['gossip_steps']} gossip step(s); gradients by "
        f"{'generalized' if res['method'] == 'gls' else 'ordinary'} least squares, each node's "
        "gradient taken as constant over the rounds (up to noise)"
    )
    if res["sigma"] == 0:
        print("sigma = 0: plain D-GD, NO PRIVACY")
    missing = [a for a in ids if a not in res["own_models"]]
    if missing:
        print(
            f"  (the gradients of member(s) {missing} are estimated like the others': their keys "
            "are not in the run directory, or their recomputation did not match the digests of "
            "what their logs say they sent)"
        )
    inv = res["inversion"]
    rows = []
    for r in res["nodes"]:
        rows.append(
            [
                str(r["node"]),
                str(r["distance"]),
                "yes" if r["reconstructed"] else "no",
                "" if r["std"] is None else f"{r['std']:.3g}",
                "" if r.get("error") is None else f"{r['error']:.3g}",
                "" if r.get("cosine") is None else f"{r['cosine']:.4f}",
            ]
        )
    heads = ["node", "dist", "identifiable", "gradient std"]
    heads += ["example rel. error", "cosine"] if inv else ["", ""]
    print(table(heads, rows))
    got = sum(1 for r in res["nodes"] if r["reconstructed"])
    print(
        f"{got} of {len(res['nodes'])} other nodes' gradients are identifiable from what the coalition saw."
    )
    if inv:
        print(
            "example: each node holds one example x; its reconstruction is gradient[:-1] / "
            "gradient[-1] (exact for a one-example gradient of a linear model with intercept), "
            "compared with the node's true example (relative L2 error, cosine)"
        )
    else:
        print(
            'no example inversion: it needs data.partition = "fixed" with data.per_node = 1 '
            "and a logistic or least-squares model with an intercept"
        )
