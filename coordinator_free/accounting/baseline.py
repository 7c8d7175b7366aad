"""The local-DP baseline every pairwise loss is read against, and what the reports say about it.

Local DP is what a node loses to an observer that sees each of its noisy values directly. No
view can reveal more than that (every message of every protocol here is computed from the
noisy values and public data), so for every pair:

* the ``exact`` loss is at most the local-DP loss; a pair strictly below it is **amplified**,
  a pair at it is **fully exposed**: the observer can solve for the source's noisy value from
  what it saw (a neighbour receives it directly);
* a ``paper`` formula above the local-DP loss is valid but useless there: the **usable** bound
  is min(paper, local DP). Reports keep the formula's value (``eps``, ``eps_max``...) and add
  the usable one beside it (``eps_usable``, ``eps_max_usable``...), and the human output
  prints the usable one, marked.

:func:`annotate_plan` and :func:`annotate_audit` add this to a report (the ``baseline`` block
and the ``*_usable`` keys); :func:`explain` turns the block into the sentences the CLI prints.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

#: A loss within this relative distance of the local-DP loss counts as equal to it.
REL_TOL = 1e-9

#: The local-DP eps a deployment would usually accept: a run above it says why (``ldp_above``).
PRACTICAL_LDP_EPS = 10.0

#: Why a protocol's example runs with local DP above :data:`PRACTICAL_LDP_EPS`, by protocol.
_WHY_ABOVE = {
    "walk-sgd": (
        "a token carries one node's noisy gradient at a time, so its noise is never averaged "
        "over nodes: with a few dozen nodes, noise meeting local DP <= 10 swamps the model. "
        "The walk's guarantee is pairwise: the amplified pairs, conditional on the walk taken"
    ),
    "decor": (
        "local DP counts every round's message as if seen without its correlated noise, over "
        "all rounds; DECOR's guarantees are SecLDP against an eavesdropper and the pairwise "
        "losses to a curious user (the amplified pairs)"
    ),
}
_WHY_ABOVE["complete-sgd"] = _WHY_ABOVE["walk-sgd"]


def practical(block: dict, protocol: str | None) -> dict:
    """Add ``ldp_above`` to a ``baseline`` block whose local DP exceeds
    :data:`PRACTICAL_LDP_EPS`: the threshold and why (the protocol's reason, or the generic
    one: the pairwise losses are the guarantee to read)."""
    ldp = block.get("ldp_eps")
    if _is_num(ldp) and ldp > PRACTICAL_LDP_EPS and not math.isinf(ldp):
        block["ldp_above"] = {
            "eps": PRACTICAL_LDP_EPS,
            "why": _WHY_ABOVE.get(
                protocol or "",
                "the noise this run needs for its accuracy costs more than that; the pairwise "
                "losses (the amplified pairs) are the guarantee to read",
            ),
        }
    return block


#: The keys of a loss entry or summary row that the usable bound caps, with the local-DP
#: key each is compared with.
_CAPPED = (
    ("eps", "eps"),
    ("eps_max", "eps"),
    ("eps_mean", "eps"),
    ("rdp", "rdp"),
    ("rdp_max", "rdp"),
    ("rdp_mean", "rdp"),
)

MARK = "^"
#: The mark of a paper figure below the exact loss of the same pair: not an upper bound there.
BELOW_MARK = "!"
BELOW_LEGEND = (
    "! the paper's formula is below the exact loss of that pair: it is not an upper bound "
    "there (the exact loss is: its column, or --method exact)"
)


def below_exact_count(rep: dict) -> int:
    """How many pairs of a report carry a paper figure below their exact loss (its
    ``baseline.paper_below_exact``; 0 when it has none)."""
    n = (rep.get("baseline") or {}).get("paper_below_exact")
    return int(n) if _is_num(n) else 0


def below_exact_legend(count: int) -> str:
    """The legend of the ``!`` mark with the count of marked pairs, as every output prints it."""
    return f"{BELOW_LEGEND} [{count} pair(s)]"


#: Up to this many nodes a paper plan counts, pair by pair, where its formula is below exact.
BELOW_EXACT_MAX_N = 512
LEGEND = (
    "^ local DP, the valid bound, is shown: the paper's formula is above it there "
    "(the formula's value: eps in --json); a formula's Renyi bound is capped by local DP in "
    "the same RDP conversion (eps_rdp of the local-DP line)"
)


def below(eps, ldp_eps):
    """Whether a loss is strictly below the local-DP loss (amplified); element-wise on arrays."""
    return eps < ldp_eps * (1.0 - REL_TOL)


def above(value, ldp_value):
    """Whether a value (a paper formula's loss) is strictly above the local-DP one; element-wise
    on arrays."""
    return value > ldp_value * (1.0 + REL_TOL)


def _is_num(x) -> bool:
    t = type(x)
    if t is float or t is int:  # the common case, first: an audit asks millions of times
        return True
    return t is not bool and isinstance(x, int | float)


def cap_entry(entry: dict, ldp: dict) -> bool:
    """Add ``<key>_usable = min(<key>, local DP)`` to ``entry`` for each capped key it has;
    return whether any of them was above local DP."""
    return capper(ldp)(entry)


def capper(ldp: dict):
    """:func:`cap_entry` with ``ldp`` read once, for the many entries of one report (an audit of
    1 024 nodes caps a million): ``cap(entry)``."""

    def num(x) -> float | None:
        return float(x) if _is_num(x) else None

    # Each capped key, the key it writes, and its bound for a Gaussian figure and for any other
    # (None: not a number, nothing capped): a Renyi bound is capped by local DP in its own
    # conversion.
    caps = [
        (
            key,
            f"{key}_usable",
            num(ldp.get(ldp_key)),
            num(ldp["eps_rdp"] if ldp_key == "eps" and "eps_rdp" in ldp else ldp.get(ldp_key)),
        )
        for key, ldp_key in _CAPPED
    ]

    def cap(entry: dict) -> bool:
        gaussian = entry.get("conversion") == "gaussian"
        exceeds = False
        for key, usable, bound_gaussian, bound_other in caps:
            have = entry.get(key)
            if have is None:  # most entries have two of the six keys
                continue
            bound = bound_gaussian if gaussian else bound_other
            if bound is not None and _is_num(have):
                have = float(have)
                entry[usable] = min(have, bound)
                exceeds = exceeds or above(have, bound)
        return exceeds

    return cap


def _ldp(rep: dict) -> dict | None:
    ldp = rep.get("ldp")
    return ldp if isinstance(ldp, dict) and _is_num(ldp.get("eps")) else None


def annotate_plan(rep: dict, *, neighbours_see_values: bool = True) -> dict:
    """A plan report with its paper entries capped (method ``paper``) and its ``baseline``
    block: the local-DP loss and how many pairs sit below it, by the report's own method.
    ``neighbours_see_values``: a neighbour receives the source's noisy value itself (gossip;
    not a token walk, whose holder receives a running value)."""
    ldp = _ldp(rep)
    if ldp is None:
        return rep
    ldp_eps = float(ldp["eps"])
    method = rep.get("method")
    block: dict = {
        "ldp_eps": ldp_eps,
        "method": method,
        "neighbours_see_values": neighbours_see_values,
    }
    entries: list[dict] = []
    if rep.get("losses") is not None:  # one source's losses
        entries = [x for x in rep["losses"] if isinstance(x, dict)]
    rows = [r for r in rep.get("by_distance") or [] if isinstance(r, dict)]
    if method == "paper":
        cap = capper(ldp)
        n_above = sum(cap(x) for x in entries)
        for r in rows:
            cap(r)
        for key in ("worst_pair", "mean_over_pairs", "max_observer_mean"):
            if isinstance(rep.get(key), dict):
                cap(rep[key])
        if not entries and rows and all("above_ldp" in r for r in rows):
            n_above = sum(int(r["above_ldp"]) for r in rows)
        block["paper_above_ldp"] = n_above
    if entries:
        eps = [float(x["eps"]) for x in entries if _is_num(x.get("eps"))]
        block.update(_counts(eps, ldp_eps, ((x.get("distance"), x["eps"]) for x in entries)))
    elif rows and all("amplified" in r for r in rows):
        pairs = sum(int(r["pairs"]) for r in rows)
        amplified = sum(int(r["amplified"]) for r in rows)
        near = sum(int(r["pairs"]) - int(r["amplified"]) for r in rows if r.get("distance") == 1)
        block.update(
            pairs=pairs, amplified=amplified, exposed=pairs - amplified, exposed_neighbours=near
        )
    rep["baseline"] = practical(block, rep.get("protocol"))
    return rep


def _counts(eps: list[float], ldp_eps: float, by_distance: Iterable[tuple]) -> dict:
    exposed_near = sum(1 for d, e in by_distance if d == 1 and _is_num(e) and not below(e, ldp_eps))
    amplified = sum(1 for e in eps if below(e, ldp_eps))
    return {
        "pairs": len(eps),
        "amplified": amplified,
        "exposed": len(eps) - amplified,
        "exposed_neighbours": exposed_near,
    }


def mark_paper_below_exact(rep: dict, planned: dict[int, dict]) -> dict:
    """Flag, in a ``paper`` plan, every figure below the exact loss of the same pair
    (``planned``: observer -> {(source, method): entry}, both methods): a one-source report's
    entries get ``below_exact`` and ``eps_exact``; the rows by distance a ``below_exact``
    count; the ``baseline`` block the total, ``paper_below_exact``."""
    below: dict[tuple[int, int], float] = {}
    for v, cells in planned.items():
        for (u, m), x in cells.items():
            if m != "paper":
                continue
            ex = cells.get((u, "exact"))
            if ex is not None and _is_num(x.get("eps")) and _is_num(ex.get("eps")):
                if x["eps"] < ex["eps"] * (1.0 - REL_TOL):
                    below[(v, u)] = float(ex["eps"])
    source = rep.get("source")
    for x in rep.get("losses") or []:
        if isinstance(x, dict) and (x.get("observer"), source) in below:
            x["below_exact"] = True
            x["eps_exact"] = below[(x["observer"], source)]
    dist_of = {}
    for v, cells in planned.items():
        for (u, _m), x in cells.items():
            if "distance" in x:
                dist_of[(v, u)] = x["distance"]
    for r in rep.get("by_distance") or []:
        if isinstance(r, dict):
            r["below_exact"] = sum(1 for p in below if dist_of.get(p) == r.get("distance"))
    if source is not None:
        count = sum(1 for (v, u) in below if u == source)
    else:
        count = len(below)
    rep.setdefault("baseline", {})["paper_below_exact"] = count
    return rep


def annotate_audit(rep: dict, *, neighbours_see_values: bool = True) -> dict:
    """An audit report with every paper entry capped and its ``baseline`` block, counted on the
    ``exact`` entries (the losses the observers really experienced)."""
    ldp = _ldp(rep)
    if ldp is None or not isinstance(rep.get("observers"), list):
        return rep
    ldp_eps = float(ldp["eps"])
    exact: list[tuple] = []
    n_above = n_below = 0
    cap = capper(ldp)
    for o in rep["observers"]:
        ex = {
            x.get("source"): x.get("eps")
            for x in o.get("losses") or []
            if isinstance(x, dict) and x.get("method") == "exact"
        }
        for x in o.get("losses") or []:
            if not isinstance(x, dict):
                continue
            if x.get("method") == "paper":
                n_above += cap(x)
                e = ex.get(x.get("source"))
                if _is_num(e) and _is_num(x.get("eps")) and x["eps"] < e * (1.0 - REL_TOL):
                    x["below_exact"] = True
                    x["eps_exact"] = float(e)
                    n_below += 1
            elif x.get("method") == "exact" and _is_num(x.get("eps")):
                exact.append((x.get("distance"), float(x["eps"])))
    block = {
        "ldp_eps": ldp_eps,
        "method": "exact",
        "neighbours_see_values": neighbours_see_values,
        "paper_above_ldp": n_above,
        "paper_below_exact": n_below,
    }
    block.update(_counts([e for _, e in exact], ldp_eps, exact))
    rep["baseline"] = practical(block, rep.get("protocol"))
    return rep


def explain(block: dict | None) -> list[str]:
    """What a ``baseline`` block means, in sentences for people (empty when there is nothing to
    say)."""
    if not block or not block.get("pairs"):
        return []
    ldp = block["ldp_eps"]
    pairs, amp, exp = block["pairs"], block["amplified"], block["exposed"]
    if math.isinf(ldp):
        return no_privacy(block)
    out = [
        f"local DP is eps = {ldp:.4g}: what each node would lose to anyone who saw its noisy "
        "values directly, the most any view can reveal."
    ]
    above = block.get("ldp_above")
    if isinstance(above, dict):
        out.append(
            f"local DP is above {above['eps']:g}, what a deployment would usually accept: {above['why']}."
        )
    n_above = block.get("paper_above_ldp")
    n_below = block.get("paper_below_exact")
    below = (
        f" For {n_below} pair(s) the paper's formula is below the exact loss: it is not an upper "
        f"bound there (marked {BELOW_MARK})."
        if n_below
        else ""
    )
    if block.get("method") == "paper":
        out.append(
            f"the paper's formula is below local DP for {amp} of {pairs} ordered pairs "
            "(source -> observer)"
            + (
                f"; for {n_above} it is above, and local DP, the valid bound, is shown there "
                "(marked ^)."
                if n_above
                else "."
            )
            + " --method exact gives the exact loss of each observer's whole view."
            + below
        )
        return out
    if amp:
        out.append(
            f"{amp} of {pairs} ordered pairs (source -> observer) are amplified: the observer "
            "saw the source's noisy values only mixed with others' noise, and loses less than "
            "local DP."
        )
    if exp:
        near = block.get("exposed_neighbours", 0) if block.get("neighbours_see_values") else 0
        why = []
        if near:
            why.append(f"{near} are neighbours, who receive the source's noisy value directly")
        if exp - near:
            who = f"{exp - near} are farther away but" if near else f"their {exp} observers"
            why.append(
                f"{who} saw enough to solve for the source's noisy values: the values they "
                "received, combined, isolate them"
            )
        out.append(f"{exp} pair(s) are fully exposed (eps = local DP): " + "; ".join(why) + ".")
    if not amp:
        out.append(
            "no pair is amplified here: every observer can invert what it saw. Amplification "
            "needs more nodes than an observer's view can pin down: a larger or sparser graph, "
            "fewer steps (docs/privacy.md)."
        )
    if n_above:
        out.append(
            f"the paper's formula exceeds local DP for {n_above} pair(s); local DP is the valid "
            "bound there, and that is what the paper columns show (marked ^)."
        )
    if below:
        out.append(below.strip())
    return out


NO_PRIVACY = "sigma = 0: plain gossip, NO PRIVACY"


def no_privacy(block: dict) -> list[str]:
    """The sentences for a report at sigma = 0 (plain gossip or D-GD, allowed to demonstrate the
    attack): local DP is infinite, and so is the loss of every pair whose view depends on the
    source at all."""
    return [
        f"{NO_PRIVACY}: the nodes add no noise, so local DP is eps = inf and any observer whose "
        "view depends on a source at all loses eps = inf about it (the inf entries); at eps = 0 "
        "the observer saw nothing that depends on the source. `cfree attack RUN --attackers A` "
        "shows what a coalition reconstructs (docs/attacks.md).",
    ]
