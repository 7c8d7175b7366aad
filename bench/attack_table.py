"""The fraction of nodes a coalition reconstructs in plain gossip averaging on Erdos-Renyi
graphs, against the expected degree and the number of attackers (the set-up of Fig. 4.2 of
E. Cyffers' thesis, scaled to this machine).

For each number of nodes n, expected degree d (edge probability d / n; a disconnected draw is
redrawn, as `graph.kind = "erdos_renyi"` does), coalition size a (nodes 0..a-1) and graph seed:
plain synchronous gossip (no acceleration, Metropolis weights) for ``int(min(d / a, n / 2))``
steps, as in the thesis' experiments; the coalition's knowledge matrix (its own inputs and
every message its members receive) is reduced exactly to reduced row echelon form
(``families.averaging.attack``), and a node counts as reconstructed when its unit row is in
that form. Each decision is checked against the coalition accountant
(``privacy.muffliato.coalition_factors``: reconstructed exactly when the factor is 1); the
table says how many disagreed (there should be none).

    python3 bench/attack_table.py --nodes 20,40,60,80 --graphs 20

prints a Markdown table: mean +- std over the graphs of the fraction of the n - a other nodes
reconstructed. The same decision on one graph, with the values themselves, from a real run:

    cfree run examples/muffliato-ring.toml --set graph.kind=erdos_renyi --set graph.nodes=40 \\
        --set graph.p=0.1 --set protocol.steps=4 --set protocol.accelerated=false \\
        --set privacy.sigma=0 --out runs/er40
    cfree attack runs/er40 --attackers 0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator_free import config  # noqa: E402
from coordinator_free.families import family_of  # noqa: E402
from coordinator_free.families.averaging import attack  # noqa: E402
from coordinator_free.graphs import GraphError  # noqa: E402
from coordinator_free.privacy import muffliato as acct  # noqa: E402


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def sets_of(n: int, d: int, a: int, seed: int, steps: int | None = None) -> list[str]:
    steps = steps or int(min(d / a, n / 2))
    return [
        "graph.kind=erdos_renyi",
        f"graph.nodes={n}",
        f"graph.p={d / n}",
        f"graph.seed={seed}",
        f"protocol.steps={steps}",
        "protocol.accelerated=false",
        "privacy.sigma=0",
        "data.dim=1",
    ]


def one(n: int, d: int, a: int, seed: int, steps: int | None = None) -> tuple[float, int]:
    """(fraction of the other nodes reconstructed, disagreements with the accountant)."""
    cfg = config.load(None, sets_of(n, d, a, seed, steps))
    plan = family_of("muffliato").make_plan(cfg)
    members = list(range(a))
    received = {
        m: np.zeros(1) for m in sorted(acct.coalition_received(plan.W, members, plan.steps))
    }
    own = {m: np.zeros(1) for m in members}
    k = attack.knowledge(plan, members, received, own)
    got = set(attack.reconstructible(k, plan.n)) - set(members)
    f = acct.coalition_factors(plan.W, plan.steps, members)
    exposed = {u for u in range(plan.n) if u not in members and f[u] >= 1 - 1e-9}
    return len(got) / (plan.n - a), len(got ^ exposed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--nodes", default="20,40,60,80", help="comma-separated n (default 20,40,60,80)"
    )
    ap.add_argument("--degrees", default="3,4,5,6", help="expected degrees n*p (default 3..6)")
    ap.add_argument("--attackers", default="1,2,3", help="coalition sizes (default 1,2,3)")
    ap.add_argument("--graphs", type=int, default=20, help="random graphs per cell (default 20)")
    ap.add_argument(
        "--steps",
        type=int,
        help="gossip steps for every cell (default: int(min(n*p / attackers, n / 2)), the thesis')",
    )
    args = ap.parse_args()
    nodes, degrees, sizes = _ints(args.nodes), _ints(args.degrees), _ints(args.attackers)
    t0 = time.perf_counter()
    disagree = 0
    print("| n | attackers | " + " | ".join(f"n·p = {d}" for d in degrees) + " |")
    print("|---|---|" + "---|" * len(degrees))
    for n in nodes:
        for a in sizes:
            cells = []
            for d in degrees:
                fr = []
                try:
                    for seed in range(args.graphs):
                        frac, bad = one(n, d, a, seed, args.steps)
                        fr.append(frac)
                        disagree += bad
                except GraphError:  # a p this low rarely gives a connected graph
                    cells.append("not connected")
                    continue
                cells.append(f"{np.mean(fr):.2f} ± {np.std(fr):.2f}")
            print(f"| {n} | {a} | " + " | ".join(cells) + " |", flush=True)
            print(f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    print(
        f"\nattack vs accountant: {disagree} disagreement(s); "
        f"{time.perf_counter() - t0:.0f} s in all",
        file=sys.stderr,
    )
    return 1 if disagree else 0


if __name__ == "__main__":
    raise SystemExit(main())
