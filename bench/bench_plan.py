"""Timings of the fault-free privacy plan on the paper's synthetic graph.

Hypercube of dimension 11 (n = 2048), Metropolis weights, Chebyshev-accelerated Muffliato with
T from the spectral gap (Theorem 2, sigma = 1, spread 0.25). Measures, for both methods
(exact joint-view loss and the paper's Eq. (6)):

* one source u = 0 towards every observer v;
* all pairs, summarised by hop distance (mean / max factor).

Run: ``python bench/bench_plan.py [--dim 11] [--json]``. Prints timings; asserts nothing.

``--graph erdos_renyi|geometric|grid`` times the exact plan of a 2048-node graph without
translation symmetry instead (Erdos-Renyi p = 0.005, geometric radius 0.05, 32 x 64 grid by
default; ``--steps`` overrides T), the way ``cfree plan`` builds it, and with ``--reference``
also the per-observer reference path (one fully re-orthogonalised Lanczos basis per observer,
the code before the fast path) in the same process: the ratio is what to compare
across runs on a shared machine. Prints the load average at start and end and the peak
resident memory after the fast path (before the reference runs). ``--sample K`` times K evenly
spaced observers only and scales the times by n / K (for schedules whose reference takes
hours); the output says so. ``--lax`` plans with ``strict=False`` (a rank decision in the
ambiguous band is kept and counted instead of raising ``NumericalRankError``: needed for the
geometric graph, whose reference raises at some observers).

``--graph G --floor`` measures what the exact plan of one source of that graph cannot take less
than with this method, whatever the code around its products: on one core, the products every
observer's fast path needs, each timed alone on arrays of that observer's shapes (its T - 1
sparse products of an n x deg block, the dense products of those Lanczos steps, the Gram
product of its n x (1 + deg T) basis in single precision that vouches for the projector, and the
two products with that basis that read the source's leverage; the double-precision Gram product
that many sources need is timed too, and a floor with it printed beside), once per degree and
summed over every observer; beside them the fast path itself on ``--sample`` evenly spaced
observers (128 by default, scaled to n); plus what ``cfree plan`` spends before its observers,
as it is now (interpreter and imports, graph, gossip matrix, spectral gap; the report's
conversions to (eps, delta) are left out, so the floor errs low). The floor is that plus the
products' CPU shared perfectly by the cores.

``--graph G --in-place`` times the fast path's observer where its products run, statement by
statement: ``muffliato._local_leverage`` recompiled with a clock (``time.perf_counter``) read
around each of its simple statements (assignments and calls, in every loop and branch; the
results are the same bits), run on one core over ``--sample`` evenly spaced observers (256 by
default), beside the same observers through the function as it is. It prints what an observer
costs either way, the share the statements account for, and each statement's milliseconds an
observer, largest first: where the fast path's time goes above the floor's products.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time

import numpy as np

from coordinator_free import blas
from coordinator_free.graphs import (
    auto_steps,
    build_graph,
    chebyshev_gamma,
    gossip_matrix,
    spectral_gap,
)
from coordinator_free.privacy import muffliato
from coordinator_free.privacy.muffliato import distance_summary, plan_factors


def hop_distances(g, n: int) -> np.ndarray:
    import networkx as nx

    d = np.full((n, n), -1, dtype=np.int64)
    for v, lengths in nx.all_pairs_shortest_path_length(g):
        for u, k in lengths.items():
            d[v, u] = k
    return d


#: ``--graph`` kinds and the config they are built from (n = 2048 each).
GRAPHS = {
    "erdos_renyi": ["graph.kind=erdos_renyi", "graph.nodes=2048", "graph.p=0.005"],
    "geometric": ["graph.kind=geometric", "graph.nodes=2048", "graph.radius=0.05"],
    "grid": ["graph.kind=grid", "graph.rows=32", "graph.cols=64"],
}


def _cpu() -> float:
    """CPU seconds of this process (every thread) and of its children that have been waited for
    (the exact plan's observers run in forked children)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        use = resource.getrusage(who)
        total += use.ru_utime + use.ru_stime
    return total


def _timed(fn):
    """(result, wall seconds, CPU seconds of this process and its children)."""
    w0, c0 = time.perf_counter(), _cpu()
    out = fn()
    return out, time.perf_counter() - w0, _cpu() - c0


def _graph_config(args):
    """``(sets, config)`` of ``--graph`` as ``cfree plan`` builds it (``--steps``: T)."""
    from coordinator_free import config as config_mod

    sets = list(GRAPHS[args.graph])
    if args.steps:
        sets.append(f"protocol.steps={args.steps}")
    return sets, config_mod.load(None, sets)


def _closed(res: dict, load0, as_json: bool) -> bool:
    """``res`` with the load average at the start (``load0``) and now and the BLAS in use; printed
    as JSON, and True, if ``as_json``."""
    import os

    res.update(load_start=load0, load_end=os.getloadavg(), blas=blas.kernels_in_use())
    if as_json:
        print(json.dumps(res, indent=2))
    return as_json


def _per_call(fn, seconds: float) -> float:
    """Thread CPU seconds of one call of ``fn``: the least of repetitions lasting ``seconds``
    in all (at least three)."""
    fn()
    best, spent, reps = math.inf, 0.0, 0
    while spent < seconds or reps < 3:
        t = time.thread_time()
        fn()
        dt = time.thread_time() - t
        best, spent, reps = min(best, dt), spent + dt, reps + 1
    return best


def observer_floor(ws, degree: int, steps: int, seconds: float = 0.02) -> dict[str, float]:
    """CPU seconds (one core) of the products an observer of the given degree needs in the exact
    plan's fast path, each timed alone on arrays of its shapes (k = degree, r = 1 + k * steps):

    * ``sparse``: its ``steps - 1`` sparse products ``W X`` of an n x k block (Lanczos steps;
      fewer where its basis spans R^n sooner), as the fast path makes them
      (``muffliato._block_product``: scipy's routine into a block it reuses);
    * ``blocks``: the dense products of those steps, each on its own: at the first step the
      projection on the first block (``B^T Z`` and ``B C``, B n x (k + 1)); at every later one
      the three-term recurrence's ``L^T Z`` (L the last block, n x k) and ``B C`` (B the last
      two blocks, n x 2k); then the new block's Gram matrix ``Z^T Z`` and its
      orthonormalisation ``Z R^-1`` (BLAS ``dtrmm``, in place, as the fast path does);
    * ``gram``: the Gram product ``Q^T Q`` of the n x r basis in double precision (which
      vouches for the projector where many sources are asked for);
    * ``gram_single``: what vouches for it for one source instead, ``muffliato._drift_bound``
      itself: the basis rounded to single precision, its Gram product in chunks of
      ``_SINGLE_ROWS`` rows, and the two norms of that r x r matrix;
    * ``refine``: one source's leverage read through products with Q: two of ``Q^T (Q x)``
      (``muffliato._refined_leverages``, which needs two on this graph).

    Nothing of the factorisations, checks, solves, copies or calls around them is in it."""
    from scipy.linalg import blas

    n = ws.shape[0]
    k = max(degree, 1)
    # A basis stops growing once it spans R^n: after ceil((n - 1) / k) blocks.
    steps = min(steps, -(-(n - 1) // k))
    rng = np.random.default_rng(degree)
    z = rng.standard_normal((n, k))
    r = min(n, 1 + k * steps)
    q = rng.standard_normal((n, r))

    def block(width: int, first: bool) -> float:
        """A step's dense products: ``width`` older columns subtracted; ``first``: projected on
        them (both products), else only the last block's coefficients are a product."""
        both = rng.standard_normal((n, width))
        last = np.ascontiguousarray(both[:, -k:])
        c = rng.standard_normal((width, k))
        zt = np.asfortranarray(z.T)
        unit = np.eye(k)  # in place, call after call: values that never grow
        return (
            _per_call(lambda: both.T @ z if first else last.T @ z, seconds / 16)
            + _per_call(lambda: both @ c, seconds / 16)
            + _per_call(lambda: z.T @ z, seconds / 16)
            + _per_call(
                lambda: blas.dtrmm(1.0, unit, zt, side=0, lower=0, trans_a=1, overwrite_b=1),
                seconds / 16,
            )
        )

    # The first step projects on the first block (k + 1 columns), every later one subtracts the
    # last two blocks (2k columns).
    blocks = 0.0 if steps < 2 else block(k + 1, True) + (steps - 2) * block(2 * k, False)
    x = rng.standard_normal((r, 1))
    product, out = muffliato._block_product(ws), np.empty((n, k))
    return {
        "sparse": (steps - 1) * _per_call(lambda: product(z, out), seconds / 4),
        "blocks": blocks,
        "gram": _per_call(lambda: q.T @ q, seconds / 4),
        "gram_single": _per_call(lambda: muffliato._drift_bound(q), seconds / 4),
        "refine": 2 * _per_call(lambda: q.T @ (q @ x), seconds / 4),
    }


def _import_seconds() -> float:
    """Wall seconds of a fresh interpreter importing ``cfree``'s command line (best of three)."""
    import subprocess

    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import coordinator_free.cli"], check=True)
        best = min(best, time.perf_counter() - t)
    return best


def exact_floor(args) -> None:
    """``--graph G --floor``: the least the exact plan of one source can take with this method
    (see the module's doc), against the fast path on the same sampled observers."""
    import os

    import scipy.sparse as sp

    from coordinator_free import forkwork
    from coordinator_free.blas import one_thread
    from coordinator_free.families import family_of

    load0 = os.getloadavg()
    imports = _import_seconds()
    _, cfg = _graph_config(args)
    t0 = time.perf_counter()
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    make_plan = time.perf_counter() - t0
    n, steps = plan.n, plan.steps
    ws = sp.csr_matrix(plan.W)
    degree = np.array([d for _, d in sorted(plan.graph.degree())], dtype=np.int64)
    obs = np.linspace(0, n - 1, args.sample or 128).astype(int)
    scale = n / obs.size
    src = np.array([0])
    # The primitives depend on an observer's degree only: timed once per degree, summed over
    # every observer (no sampling). The fast path runs on the sampled observers, in tasks of the
    # plan's size (a task reuses its work array from one observer to the next).
    degrees, counts = np.unique(degree, return_counts=True)
    parts = {"sparse": 0.0, "blocks": 0.0, "gram": 0.0, "gram_single": 0.0, "refine": 0.0}
    with one_thread():
        for i, (k, c) in enumerate(zip(degrees.tolist(), counts.tolist(), strict=True)):
            for part, sec in observer_floor(ws, k, steps).items():
                parts[part] += c * sec
            print(f"\r  primitives, degree {i + 1}/{degrees.size}", end="", file=sys.stderr)
        print("\r  the fast path on the sampled observers", end="", file=sys.stderr)
        t = time.thread_time()
        for task in forkwork.chunks(obs.size, muffliato._LOCAL_BATCH):
            muffliato._observers_factors(
                ws, plan.W, obs[task].tolist(), n, steps, src, not args.lax
            )
        fast = (time.thread_time() - t) * scale
    print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
    cores = len(os.sched_getaffinity(0))
    rest = imports + make_plan
    # One source: the basis vouched for in single precision (every observer of the Erdős–Rényi
    # graph passes that check), the leverage read through products with Q. The double-precision
    # Gram matrix is what many sources need (and one source needed before).
    one = ("sparse", "blocks", "gram_single", "refine")
    primitives = sum(parts[p] for p in one)
    primitives_double = parts["sparse"] + parts["blocks"] + parts["gram"]
    res = {
        "graph": args.graph,
        "n": n,
        "T": steps,
        "cores": cores,
        "per_observer_ms": {
            **{part: 1e3 * sec / n for part, sec in parts.items()},
            "fast_path_sampled": 1e3 * fast / n,
        },
        "fast_path_observers_sampled": int(obs.size),
        "imports_s": imports,
        "make_plan_s": make_plan,
        "primitives_cpu_s": primitives,
        "fast_path_cpu_s": fast,
        "floor_one_source_s": rest + primitives / cores,
        "floor_one_source_double_gram_s": rest + primitives_double / cores,
        "fast_path_one_source_s": rest + fast / cores,
    }
    if _closed(res, load0, args.json):
        return
    per = res["per_observer_ms"]
    print(f"{args.graph}: n={n} T={steps}, {cores} cores; load average {load0[0]:.2f} -> "
          f"{res['load_end'][0]:.2f}")  # fmt: skip
    print(f"  BLAS: {res['blas']}")
    print(f"  per observer, one core: sparse products {per['sparse']:.2f} ms, the steps' dense "
          f"products {per['blocks']:.2f} ms, single-precision Gram products "
          f"{per['gram_single']:.2f} ms, the leverage's products {per['refine']:.2f} ms (the "
          f"double-precision Gram product, for many sources: {per['gram']:.2f} ms; means over "
          f"every observer); the fast path {per['fast_path_sampled']:.2f} "
          f"ms ({obs.size} observers sampled, x {scale:.1f})")  # fmt: skip
    print(f"  the command before its observers: imports {imports:.2f} s, graph, gossip matrix "
          f"and spectral gap {make_plan:.2f} s")  # fmt: skip
    print(
        f"  with the double-precision Gram product instead: floor "
        f"{res['floor_one_source_double_gram_s']:.1f} s"
    )
    print(f"  one source, whole command: floor {res['floor_one_source_s']:.1f} s "
          f"(primitives {primitives:.1f} s of CPU); the fast path shared perfectly "
          f"{res['fast_path_one_source_s']:.1f} s ({fast:.1f} s of CPU)")  # fmt: skip


def timed_statements(fn, clock=time.perf_counter):
    """``(timed, spent)``: ``fn`` recompiled in its module's namespace with ``clock`` read around
    each of its simple statements (assignments, augmented assignments and expression statements,
    at any depth of loops, branches and ``try``); ``spent``, a dict the timed function fills, maps
    each such statement's source text to the seconds spent in it so far (summed over calls and
    over statements of the same text; ``clear()`` starts it again). The statements and their order
    are ``fn``'s own, so ``timed`` computes the same values; a statement that raises is not
    counted. Conditions, ``return`` expressions and calls in other statements are not timed."""
    import ast
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(fn))
    lines = source.splitlines()
    tree = ast.parse(source)
    simple = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr)

    def wrap(body: list) -> list:
        out = []
        for st in body:
            for field in ("body", "orelse", "finalbody"):  # a statement's own statements
                if getattr(st, field, None):
                    setattr(st, field, wrap(getattr(st, field)))
            for handler in getattr(st, "handlers", []):
                handler.body = wrap(handler.body)
            docstring = isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)
            if not isinstance(st, simple) or docstring:
                out.append(st)
                continue
            key = st.lineno
            text = repr(" ".join(x.strip() for x in lines[st.lineno - 1 : st.end_lineno]))
            out += ast.parse(f"_t_{key} = _clock_()").body
            out.append(st)
            out += ast.parse(
                f"_spent_[{text}] = _spent_.get({text}, 0.0) + _clock_() - _t_{key}"
            ).body
        return out

    fdef = tree.body[0]
    fdef.body = wrap(fdef.body)
    fdef.decorator_list = []
    ast.fix_missing_locations(tree)
    ast.increment_lineno(tree, inspect.getsourcelines(fn)[1] - 1)  # tracebacks name fn's lines
    spent: dict[str, float] = {}
    namespace = dict(fn.__globals__, _clock_=clock, _spent_=spent)
    exec(compile(tree, inspect.getsourcefile(fn) or "<timed>", "exec"), namespace)
    return namespace[fdef.name], spent


def exact_in_place(args) -> None:
    """``--graph G --in-place``: each statement of the fast path's observer timed where it runs
    (see the module's doc), beside the same observers through the function as it is."""
    import os

    import scipy.sparse as sp

    from coordinator_free.blas import one_thread
    from coordinator_free.families import family_of

    load0 = os.getloadavg()
    _, cfg = _graph_config(args)
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    n, steps = plan.n, plan.steps
    ws = sp.csr_matrix(plan.W)
    obs = np.linspace(0, n - 1, min(n, args.sample or 256)).astype(int)
    starts = [[v, *muffliato._neighbours(plan.W, v)] for v in obs.tolist()]
    src = np.array([0])
    plain = muffliato._local_leverage
    timed, spent = timed_statements(plain)

    def observers() -> tuple[list, float]:
        t = time.thread_time()
        rows = [muffliato._local_leverages(ws, [st], n, steps, src)[0] for st in starts]
        return rows, (time.thread_time() - t) / len(starts)

    with one_thread():
        observers()  # warm: imports, first-touch pages
        want, as_is = observers()
        try:
            muffliato._local_leverage = timed
            got, with_clocks = observers()
        finally:
            muffliato._local_leverage = plain
    for a, b in zip(want, got, strict=True):
        if (a is None) != (b is None) or (a is not None and not np.array_equal(a, b)):
            raise SystemExit("the timed copy of the observer computed other values")
    parts = {text: sec / len(starts) for text, sec in spent.items()}
    res = {
        "graph": args.graph,
        "n": n,
        "T": steps,
        "observers_sampled": len(starts),
        "declined": sum(r is None for r in want),
        "observer_ms": 1e3 * as_is,
        "observer_with_clocks_ms": 1e3 * with_clocks,
        "statements_ms": 1e3 * sum(parts.values()),
        "by_statement_ms": {k: 1e3 * v for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
    }
    if _closed(res, load0, args.json):
        return
    print(f"{args.graph}: n={n} T={steps}; {len(starts)} observers on one core "
          f"({res['declined']} declined to the reference, not timed here); load average "
          f"{load0[0]:.2f} -> {res['load_end'][0]:.2f}")  # fmt: skip
    print(f"  BLAS: {res['blas']}")
    print(f"  an observer: {res['observer_ms']:.2f} ms as it is, {res['observer_with_clocks_ms']:.2f} "
          f"ms with the clocks, of which its statements {res['statements_ms']:.2f} ms:")  # fmt: skip
    for text, ms in res["by_statement_ms"].items():
        if ms >= 0.005:
            print(f"  {ms:8.3f} ms  {text[:100]}")


def exact_without_symmetry(args) -> None:
    """Exact plan of a graph without translation symmetry: fast path, optionally the reference."""
    import os
    import resource

    from coordinator_free.families import family_of

    sets, cfg = _graph_config(args)
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    res: dict = {
        "graph": args.graph,
        "config": sets,
        "n": plan.n,
        "T": plan.steps,
        "mean_degree": float((np.count_nonzero(plan.W) - plan.n) / plan.n),
        "load_start": os.getloadavg(),
        "cores": len(os.sched_getaffinity(0)),
        "strict": not args.lax,
    }

    # --sample K: K evenly spaced observers, times scaled by n / K (an extrapolation, labelled)
    obs = None if not args.sample else np.linspace(0, plan.n - 1, args.sample).astype(int)
    scale = 1.0 if obs is None else plan.n / obs.size
    res["observers"] = "all" if obs is None else f"{obs.size} sampled, times x {scale:.1f}"

    def run(one: bool):
        return plan_factors(
            plan.W, plan.steps, plan.accelerated, method="exact", gamma=plan.gamma,
            sources=[0] if one else None, observers=obs, strict=not args.lax,
        )  # fmt: skip

    paths = [("fast", True)] + ([("reference", False)] if args.reference else [])
    fa = {}
    for name, fast in paths:
        muffliato._EXACT_FAST = fast
        try:
            f1, w1, c1 = _timed(lambda: run(True))
            fa[name], wa, ca = _timed(lambda: run(False))
        finally:
            muffliato._EXACT_FAST = True
        w1, c1, wa, ca = (x * scale for x in (w1, c1, wa, ca))
        res[name] = {"one_source_s": w1, "all_pairs_s": wa, "one_source_cpu_s": c1,
                     "all_pairs_cpu_s": ca,
                     "one_vs_all_maxdiff": float(np.abs(f1[:, 0] - fa[name][:, 0]).max())}  # fmt: skip
        if name == "fast":
            res["peak_gib_fast"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            # The observers run in forked children (one per core), which share the parent's
            # pages until they write them: their own peak is the largest child's.
            kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
            res["peak_gib_fast_child"] = kids
    if args.reference:
        res["maxdiff_fast_vs_reference"] = float(np.abs(fa["fast"] - fa["reference"]).max())
        for k in ("one_source_s", "all_pairs_s"):
            res[f"speedup_{k[:-2]}"] = res["reference"][k] / res["fast"][k]
    if _closed(res, res["load_start"], args.json):
        return
    print(f"{args.graph}: n={plan.n} T={plan.steps} mean degree {res['mean_degree']:.1f}, "
          f"observers: {res['observers']}")  # fmt: skip
    print(f"  BLAS: {res['blas']}")
    print(f"  load average at start {res['load_start'][0]:.2f}, end {res['load_end'][0]:.2f}")
    for name, _ in paths:
        r = res[name]
        print(f"  exact {name:<9} one source {r['one_source_s']:7.2f} s (cpu {r['one_source_cpu_s']:7.2f} s)"
              f"  all pairs {r['all_pairs_s']:7.2f} s (cpu {r['all_pairs_cpu_s']:7.2f} s)")  # fmt: skip
    print(f"  peak memory after the fast path {res['peak_gib_fast']:.2f} GiB (this process), "
          f"{res['peak_gib_fast_child']:.2f} GiB (its largest forked child)")  # fmt: skip
    if args.reference:
        print(f"  speedup: one source {res['speedup_one_source']:.1f} x, all pairs "
              f"{res['speedup_all_pairs']:.1f} x; max |fast - reference| "
              f"{res['maxdiff_fast_vs_reference']:.2e}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=11)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--graph", choices=sorted(GRAPHS), help="a graph without symmetry (exact only)")
    ap.add_argument("--steps", type=int, help="with --graph: T instead of the plan's auto T")
    ap.add_argument(
        "--reference", action="store_true", help="with --graph: also time the reference"
    )
    ap.add_argument(
        "--sample",
        type=int,
        help="with --graph: K observers only, times scaled to n (--in-place: times per observer)",
    )
    ap.add_argument("--lax", action="store_true", help="with --graph: strict=False (keep, count)")
    ap.add_argument(
        "--floor",
        action="store_true",
        help="with --graph: the least one source can take with this method (its primitives)",
    )
    ap.add_argument(
        "--in-place",
        action="store_true",
        help="with --graph: the fast path's observer timed statement by statement where it runs",
    )
    args = ap.parse_args()
    for flag, given in (("--floor", args.floor), ("--in-place", args.in_place)):
        if given and not args.graph:
            ap.error(f"{flag} needs --graph")
    if args.floor and args.in_place:
        ap.error("--floor and --in-place are separate runs: choose one")
    if args.graph and args.floor:
        exact_floor(args)
        return
    if args.graph and args.in_place:
        exact_in_place(args)
        return
    if args.graph:
        exact_without_symmetry(args)
        return

    g = build_graph("hypercube", dim=args.dim)
    w = gossip_matrix(g, "metropolis")
    n = w.shape[0]
    lam = spectral_gap(w)
    steps = auto_steps(lam, n, 1.0, 0.25, 1, True)
    gamma = chebyshev_gamma(lam)
    dist = hop_distances(g, n)
    res: dict = {"n": n, "T": steps, "lambda_W": lam, "gamma": gamma, "timings_s": {}}

    for method in ("paper", "exact"):
        t0 = time.perf_counter()
        f1 = plan_factors(w, steps, True, method=method, sources=[0])[:, 0]
        t1 = time.perf_counter()
        fa = plan_factors(w, steps, True, method=method)
        summ = distance_summary(fa, dist)
        t2 = time.perf_counter()
        res["timings_s"][f"{method}_one_source"] = t1 - t0
        res["timings_s"][f"{method}_all_pairs"] = t2 - t1
        res[f"{method}_by_distance"] = {
            str(k): {"mean": v["mean"], "max": v["max"]} for k, v in summ.items()
        }
        # one-source result agrees with the all-pairs column
        res[f"{method}_one_source_vs_all_pairs_maxdiff"] = float(np.abs(f1 - fa[:, 0]).max())
    res["blas"] = blas.kernels_in_use()

    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"hypercube dim {args.dim}: n={n} T={steps} lambda_W={lam:.4f} gamma={gamma:.5f}")
    print(f"  BLAS: {res['blas']}")
    for k, v in res["timings_s"].items():
        print(f"  {k:<22} {v:8.2f} s")
    print("  distance  paper mean  paper max   exact mean  exact max")
    for d in sorted(res["exact_by_distance"], key=int):
        p, e = res["paper_by_distance"][d], res["exact_by_distance"][d]
        print(
            f"  {int(d):>8}  {p['mean']:10.3e} {p['max']:10.3e}  {e['mean']:10.3e} {e['max']:10.3e}"
        )


if __name__ == "__main__":
    main()
