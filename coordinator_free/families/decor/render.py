"""What the CLI prints for DECOR: the learning rendering plus its SecLDP guarantee against
colluding users, and the (sigma, sigma_cor) calibration."""

from __future__ import annotations

from coordinator_free.accounting.render import fmt, print_secldp
from coordinator_free.families.averaging import render as gossip
from coordinator_free.families.learning import render as learning


def _plan_guarantee(rep: dict) -> bool:
    if "secldp" not in rep:
        return True
    print(f"sigma_cor={rep['sigma_cor']:g}  Gamma_W={fmt(rep['gamma_w'])}")
    print_secldp(rep)
    if rep.get("pairwise", True) is None:
        print("(no pairwise table above 256 nodes)")
        return False
    print("pairwise, observer = a curious user:")
    return True


def print_plan(rep: dict) -> None:
    gossip.print_gossip_plan(rep, detail=learning.rounds_line, extra=_plan_guarantee)


def print_audit(rep: dict) -> None:
    gossip.print_audit(rep)  # the generic audit prints the SecLDP block of the report


def _compact_guarantee(audit: dict) -> None:
    if "secldp" in audit:
        print("(observer = a curious user who sees every message)")
        print_secldp(audit)


def print_audit_compact(audit: dict) -> None:
    gossip.print_audit_compact(audit, extra=_compact_guarantee)


def print_calibration(rep: dict) -> None:
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
    print_secldp(rep)
    print(
        f"use it: --set privacy.sigma={rep['sigma']:.6g} --set privacy.sigma_cor={rep['sigma_cor']:.6g}"
    )


def print_summary(summary: dict, audit: dict | None) -> None:
    learning.print_learning_summary(summary)
    gossip.print_footer(summary, audit, print_audit_compact)
