"""What the CLI prints for the private-ADMM protocols, what a token (or a one-process run) is
worth (the objective and its gap to the optimum), and its yardstick."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coordinator_free import yardstick as ys
from coordinator_free.accounting.render import capped, fmt, table
from coordinator_free.families.averaging import render as gossip

ONE_PROCESS = ("admm-central", "admm-federated", "prox-sgd")


def banner(cfg, plan) -> str:
    if plan.protocol in ONE_PROCESS:
        return (
            f"running {plan.protocol} in one process: {plan.rounds} rounds, "
            f"{plan.records} records on {plan.n} users, sigma={plan.sigma}"
        )
    return (
        f"starting {plan.n} peers: admm on {cfg.graph.kind}, {plan.tokens} token(s) carrying "
        f"z_hat ({plan.dim} values), {plan.hops} hops each, gamma={plan.gamma:g}, "
        f"lam={plan.lam:g}, L={plan.clip:g}, sigma={plan.sigma}"
    )


# ------------------------------------------------------------------------------ plans


def print_guarantees(rep: dict) -> None:
    g = rep.get("guarantees") or {}
    for key, x in g.items():
        if not isinstance(x, dict):
            continue
        mark = "  <- headline" if key == g.get("headline") else ""
        print(f"  {key}: eps={fmt(x['eps'])} ({x.get('theorem', '')}){mark}")


def print_plan(rep: dict) -> None:
    if rep.get("central"):
        print(
            f"protocol={rep['protocol']}  users={rep['n']}  records={rep['records']}  "
            f"rounds={rep['rounds']}  sigma={rep['sigma']:g}  alpha={rep['alpha']}  "
            f"delta={rep['delta']:g}"
        )
        print_central_guarantees(rep)
        return
    print(
        f"protocol={rep['protocol']}  n={rep['n']}  hops per token={rep['hops']}  "
        f"tokens={rep['tokens']}  gamma={rep['gamma']:g}  lam={rep['lam']:g}  L={rep['clip']:g}  "
        f"sigma={rep['sigma']:g}  method={rep['method']}  alpha={rep['alpha']}  "
        f"delta={rep['delta']:g}"
    )
    ldp = rep["ldp"]
    amax = rep.get("alpha_max")
    print(
        f"local DP ({ldp['contributions']} contributions per user at most, the walk's bound at "
        f"delta/3, each seen directly): eps={fmt(ldp['eps'])}"
        + (f";  Theorem 8.12's orders: alpha < {amax:.4g}" if amax else "")
    )
    print(f"accounting: {rep['accounting']}")
    if rep.get("source") is not None:
        rows = [
            [str(x["observer"]), capped(x, "rdp"), capped(x, "eps"), x.get("theorem", "")]
            for x in rep["losses"]
        ]
        print(f"losses from source {rep['source']}:")
        print(table(["observer", "rdp", "eps", "from"], rows))
    else:
        w = rep["worst_pair"]
        print(
            f"every pair (the theorem holds for any observer): eps={fmt(w['eps'])}  ({w.get('theorem')})"
        )
    print_amplification(rep)
    gossip.print_plan_ending(rep)


def print_amplification(rep: dict) -> None:
    """How many pairs are below local DP, as a fraction."""
    b = rep.get("baseline") or {}
    pairs, amp = b.get("pairs"), b.get("amplified")
    if isinstance(pairs, int) and isinstance(amp, int) and pairs:
        print(
            f"pairs below local DP: {amp}/{pairs} ({100.0 * amp / pairs:.1f}%)  "
            f"(local DP eps={fmt(b['ldp_eps'])})"
        )


def print_central_guarantees(rep: dict) -> None:
    print(f"accounting: {rep['accounting']}")
    print_guarantees(rep)
    print(
        "one process, no peers and no graph: the headline is every user's loss to anyone who "
        "sees the released models; pairs and graph distances do not apply."
    )


def print_audit(rep: dict) -> None:
    gossip.print_audit(rep)
    c = rep.get("contributions")
    if c:
        print(
            f"contributions counted in the logs: max {max(c['counted'])} (plan's bound "
            f"{c['plan_bound']}), {c['unknown_steps']} step(s) no log tells"
            + (f"; above the plan's bound: users {c['above_plan']}" if c["above_plan"] else "")
        )
    if rep.get("guarantees"):
        print_guarantees(rep)


#: The columns of the compact audit, for ADMM.
TERMS = (
    "exact: Theorem 8.12 as its proof computes it for the source's contributions (counted in the "
    "logs, never below the plan), capped by local DP; paper: the theorem's printed closed form "
    "(smaller than its proof gives: a comparison); below LDP: pairs amplified, below local DP "
    "(docs/privacy.md, Private ADMM)"
)


def print_audit_compact(audit: dict) -> None:
    if audit.get("central"):
        print_central_guarantees(audit)
        return
    gossip.print_audit_compact(audit, terms=TERMS)


def print_calibration(rep: dict) -> None:
    gossip.print_calibration(rep, unit="hops")


# ------------------------------------------------------------------------------ outcomes


def token_outcomes(cfg, plan, finals: dict[int, np.ndarray]) -> dict[int, dict]:
    """Per token: the released model z of its final z_hat, its objective and its gap."""
    from coordinator_free.families.admm import protocol as ap

    fstar = ap.optimum(cfg, plan.n)[0]
    out = {}
    for j, zh in finals.items():
        z = ap.z_of(plan, np.asarray(zh, dtype=np.float64))
        f = ap.objective_value(cfg, plan, z)
        out[j] = {
            "objective": f,
            "objective_gap": f - fstar,
            "optimum": fstar,
            "test_objective": test_objective(cfg, plan.n, z),
        }
    return out


def test_objective(cfg, n: int, z: np.ndarray) -> float:
    """The objective (mean loss + regulariser) of the released model ``z`` on the test set."""
    from coordinator_free.families.admm import protocol as ap

    return ap.test_objective(cfg, n, z)


def simulator_diff(cfg, plan, run_dir: Path, results: dict, simulate) -> float | None:
    """max |peer - simulator| over the completed tokens' final z_hat; every completed token gets
    its objective and gap."""
    if plan.protocol in ONE_PROCESS:
        return None
    sim = simulate()
    diffs = []
    finals = {}
    for t in results["tokens"]:
        if "final" not in t:
            continue
        trace = sim.traces[t["token"]]
        t["simulator_max_abs_diff"] = float(
            np.max(np.abs(np.asarray(t["final"], dtype=np.float64) - trace.final))
        )
        diffs.append(t["simulator_max_abs_diff"])
        finals[t["token"]] = t["final"]
    for j, o in token_outcomes(cfg, plan, finals).items():
        results["tokens"][j].update(o)
    _write_metrics(cfg, plan, run_dir)
    return max(diffs) if diffs else None


def objective_path(cfg, plan, run_dir: Path) -> list[dict]:
    """The objective after every step of token 0, from the holders' logs (each ``token-step``
    record carries z_hat after the step when values are logged): ``[{round: step + 1,
    objective, objective_gap}]``, steps whose value no log holds left out."""
    from coordinator_free import viewlog
    from coordinator_free.families.admm import protocol as ap

    values: dict[int, np.ndarray] = {}
    for v in range(plan.n):
        path = viewlog_path(run_dir, v)
        if not path.is_file():
            continue
        try:
            records = viewlog.read_viewlog(path).records
        except Exception:  # a damaged log: its values are left out of the plot
            continue
        for r in records:
            if r.get("k") == "token-step" and r.get("token") == 0 and "value" in r:
                try:
                    values[int(r["step"])] = np.asarray(r["value"], dtype=np.float64)
                except (TypeError, ValueError):
                    continue
    if not values:
        return []
    fstar = ap.optimum(cfg, plan.n)[0]
    f0 = ap.objective_value(cfg, plan, ap.z_of(plan, np.zeros(plan.dim)))
    rows = [{"round": 0, "objective": f0, "objective_gap": f0 - fstar}]
    for s in sorted(values):
        if values[s].shape != (plan.dim,):
            continue
        f = ap.objective_value(cfg, plan, ap.z_of(plan, values[s]))
        rows.append({"round": s + 1, "objective": f, "objective_gap": f - fstar})
    return rows


def viewlog_path(run_dir: Path, v: int) -> Path:
    from coordinator_free import rundir

    return rundir.log_path(run_dir, v)


def _write_metrics(cfg, plan, run_dir: Path) -> None:
    from coordinator_free import rundir

    rows = objective_path(cfg, plan, run_dir)
    if rows:
        rundir.write_jsonl(rundir.metrics_path(run_dir), rows)


def print_summary(summary: dict, audit: dict | None) -> None:
    res = summary["results"]
    if res.get("central"):
        c = res["central"]
        print()
        print(
            f"{res['protocol']}: {res['rounds']} rounds; objective {fmt(c['objective'])}, "
            f"gap to the optimum {fmt(c['objective_gap'])} (F* = {fmt(c['optimum'])}); "
            f"{c['clipped']} clipped gradient(s); wall time {summary['wall_s']:.2f}s"
        )
        print("guarantees:")
        print_guarantees(res)
        print(
            "one process, no peers and no graph: the headline is every user's loss to anyone "
            "who sees the released models; pairs and graph distances do not apply."
        )
        gossip.print_footer(summary, None)
        return
    rows = []
    for t in res["tokens"]:
        e = t["end"]
        where = f"{e['how']} at node {e['at']}, step {e['step']}"
        q = (
            f"objective {fmt(t['objective'])}, gap {fmt(t['objective_gap'])}"
            if "objective" in t
            else "-"
        )
        rows.append([str(t["token"]), where, q])
    print()
    print(table(["token", "walk", "result"], rows))
    fin = [r for r in res["nodes"] if r["finished"]]
    lost = [r["node"] for r in res["nodes"] if not r["finished"]]
    rer = sum(len(r["reroutes"]) for r in fin)
    print(
        f"{res['hops']} hops per token; {len(fin)}/{len(res['nodes'])} nodes finished"
        + (f" (no result from {lost})" if lost else "")
        + f"; {rer} re-route(s); total bytes sent {sum(r['bytes_sent'] for r in fin)}; "
        f"wall time {summary['wall_s']:.2f}s"
    )
    gossip.print_footer(summary, audit)
    if audit is not None:
        b = audit.get("baseline") or {}
        if isinstance(b.get("pairs"), int) and b["pairs"]:
            print(
                f"pairs below local DP (audit): {b.get('amplified')}/{b['pairs']} "
                f"({100.0 * b.get('amplified', 0) / b['pairs']:.1f}%)"
            )


def simulation(cfg, r) -> dict:
    if hasattr(r, "traces"):
        out = token_outcomes(cfg, r.plan, {t.token: t.final for t in r.traces})
        return {
            "protocol": cfg.protocol.name,
            "n": r.plan.n,
            "hops": r.plan.hops,
            "tokens": [
                {"token": t.token, "final": t.final.tolist(), **out[t.token]} for t in r.traces
            ],
        }
    from coordinator_free.families.admm import central

    rows = central.metrics(cfg, r)
    return {
        "protocol": cfg.protocol.name,
        "n": r.plan.n,
        "rounds": r.plan.rounds,
        "final": r.z[-1].tolist(),
        **{k: rows[-1][k] for k in ("objective", "objective_gap")},
        "test_objective": test_objective(cfg, r.plan.n, r.z[-1]),
    }


def print_simulation(out: dict) -> None:
    if "tokens" in out:
        print(f"{out['protocol']}: n={out['n']}, {out['hops']} hops per token")
        rows = [
            [str(t["token"]), fmt(t["objective"]), fmt(t["objective_gap"])] for t in out["tokens"]
        ]
        print(table(["token", "objective", "gap"], rows))
        return
    print(
        f"{out['protocol']}: n={out['n']}, {out['rounds']} rounds: objective "
        f"{fmt(out['objective'])}, gap {fmt(out['objective_gap'])}"
    )


# ------------------------------------------------------------------------------ yardstick


def measured_test_objective(summary: dict) -> float | None:
    """The run's test objective: mean over the completed tokens (or the one-process run's)."""
    res = summary["results"]
    if res.get("central"):
        return res["central"].get("test_objective")
    done = [t["test_objective"] for t in res.get("tokens", []) if "test_objective" in t]
    return float(np.mean(done)) if done else None


def yardstick(cfg, plan, summary: dict, simulate=None) -> dict | None:
    """The learning yardstick (``ys.admm``): the released model's test objective against the
    same run without noise (sigma = 0), the trivial model z = 0 beside
    (``summary["reference"]``, :func:`references`)."""
    return ys.admm(measured_test_objective(summary), summary.get("reference"))


def references(cfg, simulate) -> dict:
    """``{"noise_free": {test_loss, objective_gap}, "trivial": {test_loss}}``: the simulator's run
    of the same config with ``privacy.sigma = 0`` (same data, shards, walk from the public seed,
    steps and clip), and the starting model ``z = 0``; ``test_loss`` is the test objective.
    ``simulate(cfg)`` is the family's simulator."""
    from coordinator_free.families.learning.reference import noise_free_config

    nf = noise_free_config(cfg)
    out = simulation(nf, simulate(nf))
    if "tokens" in out:
        test = float(np.mean([t["test_objective"] for t in out["tokens"]]))
        gap = float(np.mean([t["objective_gap"] for t in out["tokens"]]))
    else:
        test, gap = out["test_objective"], out["objective_gap"]
    z0 = np.zeros(len(out["tokens"][0]["final"]) if "tokens" in out else len(out["final"]))
    return {
        "noise_free": {"test_loss": test, "test_accuracy": None, "objective_gap": gap},
        "trivial": {
            "start": 0.0,
            "test_loss": test_objective(cfg, out["n"], z0),
            "test_accuracy": None,
        },
        "measure": "test objective",
    }
