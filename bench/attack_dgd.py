"""Gradient reconstruction and example inversion in D-GD on a line graph against the distance
to the attacker (the set-up of Fig. 4.4 of E. Cyffers' thesis, with logistic regression on the
breast-cancer data instead of CIFAR-10).

n nodes on a path, each holding one example (``data.partition = "fixed"``, ``data.per_node =
1``), D-SGD with one gossip step a round for R rounds, the attacker at one end (node 0). The
run is the in-memory network's (the node programs the peers run, every message logged as a
peer logs it); the attack reads node 0's received models only
(``families.learning.attack``), estimates every node's gradient by least squares, and inverts
it into the node's example. For every step size (and noise sigma), the table gives the median
relative L2 error of the reconstructed examples at each distance from the attacker.

    python3 bench/attack_dgd.py --nodes 31 --rounds 31 --step-sizes 0.001,0.01,0.1,0.5

One of the runs with real peers, and the attack through the CLI:

    cfree run examples/dsgd-breast-cancer.toml --set graph.kind=path --set graph.nodes=31 \\
        --set protocol.rounds=31 --set protocol.step_size=0.01 --set privacy.sigma=0 \\
        --set data.partition=fixed --set data.per_node=1 --out runs/line31
    cfree attack runs/line31 --attackers 0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator_free import config  # noqa: E402
from coordinator_free.families import family_of  # noqa: E402
from coordinator_free.families.learning import attack  # noqa: E402
from coordinator_free.inmemory import run_config  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "dsgd-breast-cancer.toml"


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def errors(n: int, rounds: int, step: float, sigma: float, seed: int) -> dict[int, float]:
    """Distance from node 0 -> relative error of the reconstructed example (one run)."""
    cfg = config.load(
        EXAMPLE,
        [
            "graph.kind=path",
            f"graph.nodes={n}",
            f"protocol.rounds={rounds}",
            f"protocol.step_size={step}",
            f"privacy.sigma={sigma}",
            "data.partition=fixed",
            "data.per_node=1",
            f"run.seed={seed}",
        ],
    )
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    mr = run_config(cfg, seed=seed)
    logs = {0: SimpleNamespace(records=[{"k": k, **f} for k, f in mr.logs[0]])}
    res = attack.run(Path("memnet"), cfg, plan, [0], logs, {0: mr.streams.node(0)})
    assert res["own_models"] == [0], "the attacker's own models did not match its log"
    return {r["distance"]: r["error"] for r in res["nodes"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=31)
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--step-sizes", default="0.001,0.01,0.1,0.5")
    ap.add_argument("--sigmas", default="0", help="noise sigma(s), comma-separated (default 0)")
    ap.add_argument("--seeds", type=int, default=1, help="runs per cell (default 1)")
    ap.add_argument(
        "--distances", default="1,2,4,8,12,16,20,24,28,30", help="distances shown (rows)"
    )
    args = ap.parse_args()
    steps, sigmas = _floats(args.step_sizes), _floats(args.sigmas)
    dists = [int(d) for d in args.distances.split(",") if int(d) < args.nodes]
    t0 = time.perf_counter()
    cols = [(s, sg) for sg in sigmas for s in steps]
    table = {}
    for s, sg in cols:
        per = [errors(args.nodes, args.rounds, s, sg, seed) for seed in range(1, args.seeds + 1)]
        table[(s, sg)] = {
            d: float(np.median([p[d] for p in per if p.get(d) is not None])) for d in dists
        }
        print(f"  step {s:g}, sigma {sg:g}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    head = " | ".join(f"ν = {s:g}" + (f", σ = {sg:g}" if len(sigmas) > 1 else "") for s, sg in cols)
    print(f"| distance | {head} |")
    print("|---|" + "---|" * len(cols))
    for d in dists:
        print(f"| {d} | " + " | ".join(f"{table[c][d]:.3g}" for c in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
