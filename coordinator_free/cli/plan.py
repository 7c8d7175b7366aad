"""``cfree plan``: the privacy plan of a config from its public parameters, or the noise that meets
a target (--target-eps)."""

from __future__ import annotations

from coordinator_free import config as config_mod
from coordinator_free.accounting.render import fmt as _fmt
from coordinator_free.accounting.render import print_secldp as _print_secldp
from coordinator_free.accounting.render import table as _table
from coordinator_free.cli.common import CliError, _emit
from coordinator_free.families import family_of


def _print_walk_plan(rep: dict) -> None:
    print(
        f"protocol={rep['protocol']}  n={rep['n']}  hops per token={rep['hops']}  "
        f"tokens={rep['tokens']}  cap={rep['cap'] or 'none'}  method={rep['method']}  "
        f"alpha={rep['alpha']}  delta={rep['delta']:g}"
    )
    ldp = rep["ldp"]
    print(
        f"LDP baseline ({ldp['contributions']:g} contributions per node, each seen directly): "
        f"eps={_fmt(ldp['eps'])}"
    )
    print(f"accounting: {rep['accounting']}")
    if rep.get("hidden_sender"):
        h = rep["hidden_sender"]
        print(
            f"for comparison, {h['note']}: worst pair eps={_fmt(h['worst_pair']['eps'])}, "
            f"mean over pairs eps={_fmt(h['mean_over_pairs']['eps'])}"
        )
    if rep.get("source") is not None:
        rows = [
            [str(x["observer"]), str(x["distance"]), _fmt(x["factor"]), _fmt(x["rdp"]),
             _fmt(x["eps"])]
            for x in rep["losses"]
        ]  # fmt: skip
        print(f"losses from source {rep['source']}:")
        print(_table(["observer", "dist", "factor", "rdp", "eps"], rows))
        return
    rows = [
        [str(r["distance"]), str(r["pairs"]), _fmt(r["factor_mean"]), _fmt(r["factor_max"]),
         _fmt(r["eps_mean"]), _fmt(r["eps_max"])]
        for r in rep["by_distance"]
    ]  # fmt: skip
    print(_table(["dist", "pairs", "factor mean", "factor max", "eps mean", "eps max"], rows))
    w = rep["worst_pair"]
    print(f"worst pair: {w['source']} -> {w['observer']}  eps={_fmt(w['eps'])}")
    print(f"mean over pairs: eps={_fmt(rep['mean_over_pairs']['eps'])}")


def _print_plan(rep: dict) -> None:
    if "hops" in rep:
        _print_walk_plan(rep)
        return
    print(
        f"n={rep['n']}  steps={rep['steps']}  accelerated={rep['accelerated']}  "
        f"spectral gap={rep['spectral_gap']:.4g}  method={rep['method']}  alpha={rep['alpha']}  "
        f"delta={rep['delta']:g}"
    )
    if "rounds" in rep:
        print(
            f"protocol={rep['protocol']}  rounds={rep['rounds']}  gossip steps per round="
            f"{rep['gossip_steps']}  sigma={rep['sigma']:g}  sensitivity={rep['sensitivity']:g}"
        )
    if "exchanges_per_node" in rep:
        x = rep["exchanges_per_node"]
        print(
            f"protocol={rep['protocol']}  clock rate={rep['clock_rate']:.4g} exchanges per clock "
            f"unit  exchanges per node: min {x['min']}, mean {x['mean']:.1f}, max {x['max']}  "
            f"Corollary 2 mean bound: factor <= {_fmt(rep['cor2_mean_factor_max'])}"
        )
    print(f"LDP baseline: rdp={_fmt(rep['ldp']['rdp'])}  eps={_fmt(rep['ldp']['eps'])}")
    if rep.get("accounting"):
        print(f"accounting: {rep['accounting']}")
    if "secldp" in rep:
        print(f"sigma_cor={rep['sigma_cor']:g}  Gamma_W={_fmt(rep['gamma_w'])}")
        _print_secldp(rep)
        if rep.get("pairwise", True) is None:
            print("(no pairwise table above 256 nodes)")
            return
        print("pairwise, observer = a curious user:")
    if rep.get("private_graph_bound"):
        pg = rep["private_graph_bound"]
        print(
            f"for comparison, {pg['note']}: worst pair eps={_fmt(pg['worst_pair']['eps'])}, "
            f"mean over pairs eps={_fmt(pg['mean_over_pairs']['eps'])}"
            + (
                ""
                if pg["condition_holds"]
                else " (its condition sigma^2 >= Delta^2 a(a-1)/2 fails)"
            )
        )
    if rep.get("source") is not None:
        rows = [
            [
                str(x["observer"]),
                str(x["distance"]),
                _fmt(x["factor"]),
                _fmt(x["rdp"]),
                _fmt(x["eps"]),
            ]
            for x in rep["losses"]
        ]
        print(f"losses from source {rep['source']}:")
        print(_table(["observer", "dist", "factor", "rdp", "eps"], rows))
        return
    rows = [
        [str(r["distance"]), str(r["pairs"]), _fmt(r["factor_mean"]), _fmt(r["factor_max"]),
         _fmt(r["rdp_mean"]), _fmt(r["rdp_max"]), _fmt(r["eps_max"])]
        for r in rep["by_distance"]
    ]  # fmt: skip
    print(
        _table(
            ["dist", "pairs", "factor mean", "factor max", "rdp mean", "rdp max", "eps max"], rows
        )
    )
    w = rep["worst_pair"]
    print(
        f"worst pair: {w['source']} -> {w['observer']}  rdp={_fmt(w['rdp'])}  eps={_fmt(w['eps'])}"
    )
    m = rep["mean_over_pairs"]
    print(f"mean over pairs: rdp={_fmt(m['rdp'])}  eps={_fmt(m['eps'])}")


def cmd_plan(args) -> int:
    from coordinator_free.accounting.audit import calibrate, plan_report

    cfg = config_mod.load(args.config, args.set)
    if args.target_eps is not None:
        if args.source is not None:
            raise CliError("--target-eps calibrates over all pairs; drop --source")
        rep = calibrate(
            cfg, args.target_eps, method=args.method, budget=args.budget, decor_pair=args.pair
        )
        return _emit(args, rep, _print_calibration)
    return _emit(args, plan_report(cfg, source=args.source, method=args.method), _print_plan)


def _print_decor_calibration(rep: dict) -> None:
    print(
        f"decor: sigma = {rep['sigma']:.6g}, sigma_cor = {rep['sigma_cor']:.6g} ({rep['choice']} "
        f"of {len(rep['pairs'])} pairs) meet eps <= {rep['target_eps']:g} at delta = "
        f"{rep['delta']:g} over {rep['rounds']} rounds, {rep['budget']}"
    )
    print(
        f"  sigma ranges over ({rep['sigma_cdp_floor']:.6g}, {rep['sigma_ldp']:.6g}]: central-DP "
        "noise per node at the floor, local DP at the top"
    )
    for k in ("low", "mid", "high"):
        x = rep[k]
        print(f"  {k:>4}: sigma = {x['sigma_cdp']:.6g}, sigma_cor = {x['sigma_cor']:.6g}")
    _print_secldp(rep)
    print(
        f"use it: --set privacy.sigma={rep['sigma']:.6g} --set privacy.sigma_cor={rep['sigma_cor']:.6g}"
    )


def _print_calibration(rep: dict) -> None:
    if "secldp" in rep:  # DECOR's search is over (sigma, sigma_cor) pairs
        _print_decor_calibration(rep)
        return
    b = rep["binding"]
    what = (
        f"binding pair {b['source']} -> {b['observer']}"
        if rep["budget"] == "worst"
        else "binding: the mean over pairs"
    )
    print(
        f"{rep['protocol']}: sigma = {rep['sigma']:.6g} meets eps <= {rep['target_eps']:g} at "
        f"delta = {rep['delta']:g} ({rep['method']} method, {rep['budget']} budget, "
        f"sensitivity {rep['sensitivity']:g}, {rep['steps']} "
        f"{family_of(rep['protocol']).step_unit})"
    )
    print(f"  {what}: rdp = {_fmt(b.get('rdp'))}, eps = {_fmt(b['eps'])}")
    w, m = rep["worst_pair"], rep["mean_over_pairs"]
    print(f"  worst pair {w['source']} -> {w['observer']}: eps = {_fmt(w['eps'])}")
    print(
        f"  mean over pairs: eps = {_fmt(m['eps'])};  local DP at this sigma: eps = {_fmt(rep['ldp']['eps'])}"
    )
    if rep.get("accounting"):
        print(f"  accounting: {rep['accounting']}")
    print(f"use it: --set privacy.sigma={rep['sigma']:.6g}")
