"""Topologies, gossip matrices and spectral quantities.

Nodes are always the integers ``0..n-1``. Gossip matrices are dense float64 numpy arrays built
from the graph alone, so every peer (which knows the public graph) derives the same row it uses
and the auditor derives the same matrix it replays.
"""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx
import numpy as np

from coordinator_free.errors import CfreeError

GRAPH_KINDS = (
    "ring",
    "path",
    "complete",
    "star",
    "grid",
    "torus",
    "hypercube",
    "erdos_renyi",
    "geometric",
    "edgelist",
)
WEIGHT_SCHEMES = ("metropolis", "max-degree", "lazy")


class GraphError(CfreeError, ValueError):
    pass


def _relabel(g: nx.Graph) -> nx.Graph:
    """Relabel nodes to 0..n-1 in sorted order of their original labels."""
    mapping = {node: i for i, node in enumerate(sorted(g.nodes()))}
    out = nx.Graph()
    out.add_nodes_from(range(len(mapping)))
    out.add_edges_from((mapping[a], mapping[b]) for a, b in g.edges() if a != b)
    return out


def build_graph(
    kind: str,
    *,
    nodes: int | None = None,
    dim: int | None = None,
    rows: int | None = None,
    cols: int | None = None,
    p: float | None = None,
    radius: float | None = None,
    path: str | Path | None = None,
    seed: int = 0,
    max_tries: int = 200,
) -> nx.Graph:
    """Build a connected undirected graph on nodes 0..n-1."""
    if kind == "ring":
        g = nx.cycle_graph(nodes)
    elif kind == "path":
        g = nx.path_graph(nodes)
    elif kind == "complete":
        g = nx.complete_graph(nodes)
    elif kind == "star":
        g = nx.star_graph(nodes - 1)
    elif kind == "grid":
        g = _relabel(nx.grid_2d_graph(rows, cols))
    elif kind == "torus":  # the grid with wrap-around edges (every node has degree 4)
        g = _relabel(nx.grid_2d_graph(rows, cols, periodic=True))
    elif kind == "hypercube":
        g = _relabel(nx.hypercube_graph(dim))
    elif kind in ("erdos_renyi", "geometric"):
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0x6E7]))
        for _ in range(max_tries):
            s = int(rng.integers(2**63))
            if kind == "erdos_renyi":
                g = gnp_graph(nodes, p, s)
            else:
                g = nx.random_geometric_graph(nodes, radius, seed=s)
            if nx.is_connected(g):
                break
        else:
            raise GraphError(
                f"{kind} graph with nodes={nodes} and "
                f"{'p=' + str(p) if kind == 'erdos_renyi' else 'radius=' + str(radius)} "
                f"was not connected in {max_tries} draws; increase "
                f"{'p' if kind == 'erdos_renyi' else 'radius'}"
            )
        g = _relabel(g)
    elif kind == "edgelist":
        g = read_edgelist(path)
    else:
        raise GraphError(f"unknown graph kind {kind!r}; expected one of {', '.join(GRAPH_KINDS)}")
    g = _relabel(g) if kind != "edgelist" else g
    if g.number_of_nodes() < 2:
        raise GraphError("a graph needs at least 2 nodes")
    if not nx.is_connected(g):
        raise GraphError(f"the {kind} graph is not connected")
    return g


#: Coin flips drawn at a time by :func:`gnp_graph` (32 MiB of doubles).
_GNP_CHUNK = 1 << 22


def gnp_graph(nodes: int, p: float, seed: int) -> nx.Graph:
    """``networkx.gnp_random_graph(nodes, p, seed=seed)``: the same graph, edge for edge and in
    the same order, drawn in numpy (0.03 s instead of 0.15 s at 2 048 nodes).

    That generator flips one coin per pair ``(i, j)``, i < j, in lexicographic order, with
    ``random.Random(seed).random() < p``. Python seeds its Mersenne Twister from the seed's
    32-bit words (``init_by_array``), as numpy's legacy ``RandomState`` does from an array of
    two or more words, and both make a double from two 32-bit outputs the same way
    (``(a >> 5) * 2^26 + (b >> 6)) / 2^53``): the same coins. A seed of one word (below 2^32,
    which numpy would seed differently), and p outside (0, 1), go to networkx itself."""
    words = []
    rest = seed
    while rest > 0:
        words.append(rest & 0xFFFFFFFF)
        rest >>= 32
    if seed < 0 or len(words) < 2 or not 0.0 < p < 1.0:
        return nx.gnp_random_graph(nodes, p, seed=seed)
    coins = np.random.RandomState(np.array(words, dtype=np.uint32))
    # Pair (i, j) is coin number starts[i] + (j - i - 1), starts[i] the pairs of rows before i.
    starts = np.concatenate(([0], np.cumsum(np.arange(nodes - 1, 0, -1, dtype=np.int64))))
    total = nodes * (nodes - 1) // 2
    g = nx.empty_graph(nodes)
    for lo in range(0, total, _GNP_CHUNK):
        hit = lo + np.flatnonzero(coins.random_sample(min(_GNP_CHUNK, total - lo)) < p)
        i = np.searchsorted(starts, hit, side="right") - 1
        j = hit - starts[i] + i + 1
        g.add_edges_from(zip(i.tolist(), j.tolist(), strict=True))
    return g


def read_edgelist(path: str | Path) -> nx.Graph:
    """Read ``u v`` pairs (one per line, ``#`` comments) of non-negative integer node ids."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise GraphError(f"cannot read edge list {p}: {exc.strerror}") from None
    g = nx.Graph()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").split()
        if len(parts) != 2:
            raise GraphError(f"{p}:{lineno}: expected two node ids, got {raw!r}")
        try:
            a, b = int(parts[0]), int(parts[1])
        except ValueError:
            raise GraphError(f"{p}:{lineno}: node ids must be integers, got {raw!r}") from None
        if a < 0 or b < 0:
            raise GraphError(f"{p}:{lineno}: node ids must be non-negative")
        if a == b:
            raise GraphError(f"{p}:{lineno}: self-loop on node {a}")
        g.add_edge(a, b)
    if g.number_of_nodes() == 0:
        raise GraphError(f"{p}: no edges")
    ids = sorted(g.nodes())
    if ids != list(range(len(ids))):
        missing = sorted(set(range(max(ids) + 1)) - set(ids))[:5]
        raise GraphError(f"{p}: node ids must be 0..n-1 without gaps (missing e.g. {missing})")
    out = nx.Graph()
    out.add_nodes_from(range(len(ids)))
    out.add_edges_from(g.edges())
    return out


#: Above this many nodes a Muffliato plan on a graph with translation symmetry keeps its gossip
#: matrix sparse (``gossip_matrix(..., sparse=True)``), its spectrum from the group's transform
#: (:func:`spectral_gap`): a dense n x n matrix of 8192 nodes is 512 MiB and its eigenvalues
#: take a minute; of 16384 nodes, 2 GiB.
DENSE_MAX_N = 4096
#: Graph kinds whose node labels carry a translation symmetry of their gossip matrices
#: (:func:`translation_group`): the hypercube (XOR) and the ring (cyclic shifts).
TRANSLATION_KINDS = ("hypercube", "ring")


def gossip_matrix(g: nx.Graph, weights: str = "metropolis", *, sparse: bool = False):
    """Symmetric doubly stochastic gossip matrix supported on ``g`` (a dense array, or with
    ``sparse`` a scipy CSR matrix holding the same numbers).

    ``metropolis``: W_uv = 1/(1 + max(d_u, d_v)) on edges (the weights the papers' experiments
    really used, there called "Hamilton"); ``max-degree``: W_uv = 1/(1 + d_max); ``lazy``:
    W_uv = 1/n (I - L/n), which a node computes knowing only its own degree. The diagonal takes
    the rest of each row.
    """
    n = g.number_of_nodes()
    deg = np.array([g.degree(v) for v in range(n)], dtype=np.int64)
    dmax = int(deg.max())
    rows: list[dict[int, float]] = [{} for _ in range(n)]
    for a, b in g.edges():
        if weights == "metropolis":
            val = 1.0 / (1 + max(deg[a], deg[b]))
        elif weights == "max-degree":
            val = 1.0 / (1 + dmax)
        elif weights == "lazy":  # needs no degree at all: what a node of a secret graph can use
            val = 1.0 / n
        else:
            raise GraphError(f"unknown weights {weights!r}; expected one of {WEIGHT_SCHEMES}")
        rows[a][b] = rows[b][a] = float(val)
    # Diagonal: 1 - the sum of the off-diagonal entries (fsum is exact: the order of the terms,
    # each peer's own or the matrix's, changes nothing).
    for v in range(n):
        rows[v][v] = 1.0 - math.fsum(x for u, x in rows[v].items() if u != v)
    if sparse:
        import scipy.sparse as sp

        indptr = np.zeros(n + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(r) for r in rows])
        cols = np.fromiter((u for r in rows for u in sorted(r)), dtype=np.int64, count=indptr[-1])
        vals = np.fromiter(
            (r[u] for r in rows for u in sorted(r)), dtype=np.float64, count=indptr[-1]
        )
        return sp.csr_matrix((vals, cols, indptr), shape=(n, n))
    w = np.zeros((n, n), dtype=np.float64)
    for v, r in enumerate(rows):
        for u, x in r.items():
            w[v, u] = x
    return w


def spectral_gap(w: np.ndarray) -> float:
    """lambda_W = min over eigenvalues lambda != 1 of (1 - |lambda|) (Definition 2).

    Computed on one BLAS thread: peers, simulator and planner get the same last bits
    (:mod:`coordinator_free.blas`). A sparse ``w`` with a translation group has its spectrum
    from the group's transform (:func:`group_spectrum`); without one it is made dense."""
    from coordinator_free.blas import one_thread

    if not isinstance(w, np.ndarray):
        ev = group_spectrum(w)
        if ev is None:  # no symmetry to use: the dense way
            w = w.toarray()
    if isinstance(w, np.ndarray):
        with one_thread():
            ev = np.linalg.eigvalsh(w)
    ev = np.sort(ev)
    # Drop one eigenvalue 1 (the consensus direction); the graph is connected so it is simple.
    rest = ev[:-1]
    return float(np.min(1.0 - np.abs(rest)))


def _invariant(ws, perm: np.ndarray) -> bool:
    """Whether the node relabelling ``perm`` maps the sparse W onto itself exactly."""
    moved = ws[perm][:, perm]
    return (moved != ws).nnz == 0


def translation_group(ws) -> str | None:
    """``"xor"`` when the translations ``u -> u ^ c`` are automorphisms of the (sparse) W (n a
    power of two; checked on the generators ``c = 2^k``: the hypercube's labels), ``"cyclic"``
    when ``u -> u + c mod n`` are (checked on ``c = 1``: the ring's), else None. Each check is
    exact, entry by entry; a group generated by exact automorphisms consists of them, and it
    maps node 0 to every node."""
    import scipy.sparse as sp

    ws = sp.csr_matrix(ws)
    n = ws.shape[0]
    idx = np.arange(n)
    if n > 1 and n & (n - 1) == 0:
        if all(_invariant(ws, idx ^ (1 << k)) for k in range(n.bit_length() - 1)):
            return "xor"
    if n > 2 and _invariant(ws, (idx + 1) % n):
        return "cyclic"
    return None


def group_spectrum(ws) -> np.ndarray | None:
    """The eigenvalues of a sparse W that its translation group diagonalises, from W's first
    row: the Walsh-Hadamard transform (XOR) or the discrete Fourier transform (cyclic), in
    n log n; None without such a group."""
    group = translation_group(ws)
    if group is None:
        return None
    c = np.asarray(ws.getrow(0).toarray(), dtype=np.float64).ravel()
    if group == "cyclic":
        return np.sort(np.fft.fft(c).real)
    h = 1
    while h < c.size:  # in-place fast Walsh-Hadamard transform
        c = c.reshape(-1, 2, h)
        c = np.concatenate([c[:, 0] + c[:, 1], c[:, 0] - c[:, 1]], axis=1).reshape(-1)
        h *= 2
    return np.sort(c)


def chebyshev_gamma(lam: float) -> float:
    """Optimal re-scaled Chebyshev parameter of Algorithm 1 (gamma in [1, 2))."""
    c = 1.0 - lam / 2.0
    return 2.0 / (1.0 + math.sqrt(max(0.0, 1.0 - c * c)))


def auto_steps(lam: float, n: int, sigma: float, spread: float, dim: int, accelerated: bool) -> int:
    """T^stop of Theorems 2/7: precision 3 D sigma^2 / n.

    T = rate^{-1} ln( n/(D sigma^2) * max(D sigma^2, spread) ), rate = sqrt(lambda_W) with
    Chebyshev acceleration, lambda_W without. ``spread`` is a public bound on
    (1/n) sum_v ||x_v - xbar||^2.
    """
    d_sigma2 = dim * sigma * sigma
    arg = (n / d_sigma2) * max(d_sigma2, spread)
    rate = math.sqrt(lam) if accelerated else lam
    return max(1, math.ceil(math.log(max(arg, math.e)) / rate))


def distances_from(g: nx.Graph, source: int) -> np.ndarray:
    n = g.number_of_nodes()
    out = np.full(n, -1, dtype=np.int64)
    for v, d in nx.single_source_shortest_path_length(g, source).items():
        out[v] = d
    return out


def all_distances(g: nx.Graph) -> np.ndarray:
    """Hop distances between all pairs, as an (n, n) integer matrix (BFS in scipy)."""
    from scipy.sparse.csgraph import shortest_path

    n = g.number_of_nodes()
    adj = nx.to_scipy_sparse_array(g, nodelist=range(n), format="csr")
    d = shortest_path(adj, method="D", unweighted=True, directed=False)
    return np.where(np.isfinite(d), d, -1).astype(np.int64)


def realised_row(row: dict[int, float], own: int, got: set[int]) -> dict[int, float]:
    """The row of M_t a node actually applied: missed neighbours' weight moved to itself."""
    out = {w: 0.0 for w in row}
    for w, wt in row.items():
        if w == own or w in got:
            out[w] += wt
        else:
            out[own] += wt
    return out
