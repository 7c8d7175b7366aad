"""User-level privacy accountant of DECOR (pairwise-cancelling correlated noise), per round.

Mechanism of one round t (d = 1 w.l.o.g.; coordinates are independent and identical). Every node
i publishes

    y_i = g_i + vbar_i + sum_{terms (i, j) that i added} s_ij z_ij,      vbar_i ~ N(0, sigma_cdp^2),

where g_i is i's clipped gradient, z_ij ~ N(0, sigma_cor^2) is drawn from a seed shared by i and j
only, and s_ij = +1 if i < j else -1. When both ends add the term of edge {i, j} with the same key
the two copies cancel in the network sum. Changing user i's data moves g_i by at most
``sensitivity`` (Delta = 2C with clipping C) in L2.

Realised rounds (dropouts, keys that do not match). A *term key* is one independent standard
normal scaled by sigma_cor: the shared z_ij of an edge whose two ends both added their term with
the same key, or an own-only z for a term added by one end only (the other end did not add it,
did not publish, or added it under a different key: an "unmatched" pair). Stack the noises as
w = [vbar; z] and write the published vector as y_P = g_P + A_P w.

The adversary. It sees every published y_p (p in the published set P) and holds the secrets of a
coalition Q (Q = {} is the external eavesdropper, |Q| = 1 a curious user, |Q| = q collusion level
q): it knows vbar_k for k in Q and every z whose edge touches Q. Subtracting the known terms is an
invertible linear map of its view, after which the part that depends on the honest users is

    y'_H = g_H + vbar_H + B_H z_H,        H = P \\ Q,

with z_H the keys that touch no colluder and B_H their signed incidence restricted to H (a key
shared by two honest published nodes is a column with +1 and -1; any other key is a column with a
single +-1). The rest of the view is independent of y'_H and of the data. Hence

    y'_H ~ N(g_H, Sigma),   Sigma = sigma_cdp^2 I + sigma_cor^2 M,   M = B_H B_H^T,

which :func:`round_matrix` builds from the realised terms: M_ii = the number of terms i added whose
other end is not in Q (own-only terms still count: they are noise only y_i contains), and
M_ij = -1 iff i, j are both in H, both added the term of {i, j} and the pair is not unmatched.
Fault-free (every node adds every neighbour, all publish) this gives M = L(G[H]), the Laplacian of
the induced subgraph on the honest nodes: a term towards a colluder simply disappears.

Per-round RDP. Sigma is positive definite for sigma_cdp > 0. For Gaussians with a common
covariance D_alpha(N(m1, Sigma) || N(m2, Sigma)) = (alpha/2) (m1 - m2)^T Sigma^{-1} (m1 - m2),
and changing user i's data shifts only y_i, by a d-vector of norm <= Delta; with d coordinates
the covariance is Sigma (x) I_d, so the quadratic form is [Sigma^{-1}]_ii ||shift||^2, hence

    RDP_i(alpha) = alpha * rho_i,     rho_i = (Delta^2 / 2) [Sigma^{-1}]_ii     (Algorithms 2/3).

Against collusion level q, rho_i is the worst over coalitions |Q| = q not containing i
(:func:`graph_step_rho`, :class:`SpectralGraph`).

Composition. Rounds use fresh noise, so linear RDP curves add: a run with per-round rho_{i,t} is
(alpha, alpha * sum_t rho_{i,t})-RDP for every alpha > 1 (adaptive composition). The whole-run
(eps, delta) comes from the total rho through :mod:`coordinator_free.privacy.rdp`
(:func:`conversions`): the improved conversion (reported), Mironov's rho + 2 sqrt(rho log 1/delta)
(the paper's), and the exact Gaussian curve with mu^2 = 2 rho (valid because the view of one round
is a Gaussian mean shift, and Gaussian shifts compose to a Gaussian shift).

Closed form (Theorems 1 and 6). Fault-free, Sigma^{-1} has the eigenvalue 1/sigma_cdp^2 on the
constant vector and at most 1/(sigma_cdp^2 + a sigma_cor^2), a = lambda_2(L(G[H])), on its
complement. Writing e_i = 1/|H| + u with ||u||^2 = 1 - 1/|H| gives

    [Sigma^{-1}]_ii <= 1/(|H| sigma_cdp^2) + (1 - 1/|H|)/(sigma_cdp^2 + a sigma_cor^2),

and over |Q| = q, |H| = n - q and a >= a_q(G) = min_Q lambda_2(L(G - Q)) (:func:`closed_form_rho`,
:func:`algebraic_connectivity`). Equality holds on the complete graph. Since deleting a vertex
lowers the algebraic connectivity by at most one (Fiedler 1973), max(0, a(G) - q) <= a_q(G) is a
valid substitute when the coalitions are too many to enumerate.

Numerics. Only the diagonal of Sigma^{-1} is needed. When sigma_cor >> sigma_cdp, Sigma is badly
conditioned (cond ~ sigma_cor^2 lambda_max / sigma_cdp^2) only because of the null space of M:
the indicator 1_c of every connected component c of M's graph whose rows sum to zero (a component
with no own-only term) has M 1_c = 0. That direction is known exactly, so :func:`inverse_diagonal`
factors the deflated matrix K = Sigma + sum_c (tau_c / m_c) 1_c 1_c^T (m_c = |c|, tau_c =
sigma_cdp^2 + sigma_cor^2 * mean degree of c), whose condition number does not grow with
sigma_cor, and adds back the exact difference

    [Sigma^{-1}]_ii = [K^{-1}]_ii + (1/sigma_cdp^2 - 1/(sigma_cdp^2 + tau_c)) / m_c,   i in c,

(1_c is an eigenvector of both). Dense: Cholesky of K. Sparse: LU of the arrow matrix
[[Sigma, C], [C^T, -D]] with one extra row per deflated component (C = (tau_c/m_c) 1_c,
D = tau_c/m_c), whose Schur complement is K, solved against blocks of identity columns.
:class:`SpectralGraph` uses L(G[H]) = U diag(lambda) U^T with the null eigenvalues set to exactly
0 and their projector diagonal 1/m_c written exactly. Both stay accurate for any sigma_cor.

Calibration (App. D.1, :func:`calibrate_pairs`). The per-round budget is rho1 = rho(eps)/T.
sigma_cor = 0 reaches it with sigma_LDP = Delta / sqrt(2 rho1); sigma_cor -> infinity leaves
rho_i -> Delta^2/(2 |H| sigma_cdp^2) (connected G[H]), hence the floor sigma_CDP = sigma_LDP /
sqrt(n - q). For sigma_cdp on a grid of (sigma_CDP, sigma_LDP] the smallest sigma_cor reaching
rho1 is found by bisection (rho is non-increasing in sigma_cor).

Utility side (Lemma 8): after one gossip step the correlated noise has energy
E||V W||_F^2 = |E| d sigma_cor^2 Gamma_W with Gamma_W = (1/|E|) sum_{{i,j} in E} ||W_i - W_j||^2
(:func:`gamma_w`; W_i the i-th column of the mixing matrix).
"""

from __future__ import annotations

import itertools
import math
import operator
import warnings
from collections.abc import Callable, Iterable, Mapping

import networkx as nx
import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy.sparse import csgraph

from coordinator_free.privacy import rdp

__all__ = [
    "TooManyCoalitions",
    "coalitions",
    "round_matrix",
    "inverse_diagonal",
    "graph_step_rho",
    "SpectralGraph",
    "closed_form_rho",
    "algebraic_connectivity",
    "gamma_w",
    "conversions",
    "rho_for_eps",
    "calibrate_pairs",
    "choose_pair",
]

#: Identity columns solved at once by the sparse path of :func:`inverse_diagonal`.
SPARSE_BLOCK = 256
#: Largest bracket of the sigma_cor search, in units of the sensitivity.
SIGMA_COR_MAX = 1e12
#: Calibration accepts rho_step <= rho1 * (1 + RHO_SLACK): the LDP end sigma_LDP reaches rho1
#: exactly in real arithmetic, and a caller's float path may land an ulp or two above it.
RHO_SLACK = 1e-13


class TooManyCoalitions(ValueError):
    """Enumerating every coalition of the requested size would exceed ``max_coalitions``."""


# --------------------------------------------------------------------------------------------
# input checks


def _node_id(x, n: int, what: str) -> int:
    try:
        i = operator.index(x)
    except TypeError:
        raise ValueError(f"{what}: node id must be an integer, got {x!r}") from None
    if not 0 <= i < n:
        raise ValueError(f"{what}: node id {i} out of range 0..{n - 1}")
    return i


def _sigmas(sigma_cdp: float, sigma_cor: float) -> tuple[float, float]:
    """(sigma_cdp^2, sigma_cor^2) after checking sigma_cdp > 0 and sigma_cor >= 0 (finite)."""
    if not (math.isfinite(sigma_cdp) and sigma_cdp > 0):
        raise ValueError(f"sigma_cdp must be a finite positive number, got {sigma_cdp!r}")
    if not (math.isfinite(sigma_cor) and sigma_cor >= 0):
        raise ValueError(f"sigma_cor must be a finite non-negative number, got {sigma_cor!r}")
    return float(sigma_cdp) ** 2, float(sigma_cor) ** 2


def _check_sensitivity(sensitivity: float) -> float:
    if not (math.isfinite(sensitivity) and sensitivity >= 0):
        raise ValueError(f"sensitivity must be a finite non-negative number, got {sensitivity!r}")
    return float(sensitivity)


def _graph_edges(graph: nx.Graph) -> tuple[int, np.ndarray]:
    """(n, edges as an (|E|, 2) int array) of an undirected graph labelled 0..n-1."""
    if graph.is_directed():
        raise ValueError("the graph must be undirected")
    n = graph.number_of_nodes()
    if n == 0:
        raise ValueError("the graph has no nodes")
    if set(graph.nodes) != set(range(n)):
        raise ValueError(
            f"graph nodes must be labelled 0..{n - 1} (see nx.convert_node_labels_to_integers)"
        )
    edges = np.array([(int(u), int(v)) for u, v in graph.edges()], dtype=np.int64).reshape(-1, 2)
    loops = edges[edges[:, 0] == edges[:, 1]]
    if loops.size:
        raise ValueError(
            f"self-loop at node {int(loops[0, 0])}: a node has no edge term with itself"
        )
    return n, edges


def _adjacency(n: int, edges: np.ndarray) -> sp.csr_matrix:
    a = sp.coo_matrix(
        (
            np.ones(2 * len(edges)),
            (np.r_[edges[:, 0], edges[:, 1]], np.r_[edges[:, 1], edges[:, 0]]),
        ),
        shape=(n, n),
    ).tocsr()
    a.data[:] = 1.0  # a multigraph's parallel edges are one edge (one shared seed)
    return a


def _check_collusion(collusion: int, n: int) -> int:
    q = operator.index(collusion)
    if q < 0:
        raise ValueError(f"collusion must be >= 0, got {q}")
    if q >= n:
        raise ValueError(f"collusion {q} leaves no honest user among n = {n}")
    return q


def coalitions(n: int, q: int, max_coalitions: int = 20000) -> list[tuple[int, ...]]:
    """Every coalition of q of the n nodes, refused (TooManyCoalitions) past max_coalitions."""
    count = math.comb(n, q)
    if count > max_coalitions:
        raise TooManyCoalitions(
            f"collusion level {q} on n = {n} nodes needs C({n}, {q}) = {count} coalitions "
            f"(max_coalitions = {max_coalitions}); raise max_coalitions, or use the closed-form "
            f"bound closed_form_rho(n, a_q, ...) with a lower bound on a_q such as "
            f"max(0, algebraic_connectivity(graph) - {q}) (Fiedler: deleting a vertex lowers "
            f"lambda_2 by at most 1)"
        )
    return list(itertools.combinations(range(n), q))


def _induced_laplacian(adj: sp.csr_matrix, honest: np.ndarray) -> sp.csr_matrix:
    sub = adj[honest][:, honest]
    return (sp.diags(np.asarray(sub.sum(axis=1)).ravel()) - sub).tocsr()


# --------------------------------------------------------------------------------------------
# one realised round


def round_matrix(
    n: int,
    added: Mapping[int, Iterable[int]],
    *,
    published: Iterable[int] | None = None,
    colluders: Iterable[int] = (),
    unmatched: Iterable[Iterable[int]] = (),
) -> tuple[np.ndarray, sp.csr_matrix]:
    """Honest published node ids H (sorted) and M = B_H B_H^T (|H| x |H|) of one realised round.

    ``added[i]``: the peers j whose edge term node i added this round. ``published``: the nodes
    whose round value was observed (None = all). ``colluders``: the coalition Q (knows every
    secret of an edge touching Q). ``unmatched``: pairs {i, j} whose two terms used different keys
    (independent noises, no cancellation). Sigma of the honest view is
    sigma_cdp^2 I + sigma_cor^2 M (module doc). Raises ValueError on an id out of range, a self
    term, a peer listed twice or a malformed unmatched pair.
    """
    n = operator.index(n)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    terms: dict[int, set[int]] = {}
    for key, peers in added.items():
        i = _node_id(key, n, "added")
        if i in terms:
            raise ValueError(f"added: node {i} appears twice as a key")
        seen: set[int] = set()
        for peer in peers:
            j = _node_id(peer, n, f"added[{i}]")
            if j == i:
                raise ValueError(f"added[{i}] contains {i}: a node has no edge term with itself")
            if j in seen:
                raise ValueError(f"added[{i}] lists peer {j} twice (a term is added once per edge)")
            seen.add(j)
        terms[i] = seen
    pub = set(range(n)) if published is None else {_node_id(p, n, "published") for p in published}
    coal = {_node_id(k, n, "colluders") for k in colluders}
    odd: set[frozenset[int]] = set()
    for pair in unmatched:
        ids = [_node_id(x, n, f"unmatched {pair!r}") for x in pair]
        if len(ids) != 2 or ids[0] == ids[1]:
            raise ValueError(f"unmatched entry {pair!r} must be a pair of two distinct nodes")
        odd.add(frozenset(ids))

    honest = np.array(sorted(pub - coal), dtype=np.int64)
    pos = {int(v): k for k, v in enumerate(honest)}
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for i in honest.tolist():
        for j in terms.get(i, ()):
            if j in coal:
                continue  # the coalition knows z_ij and subtracts it
            rows.append(pos[i])
            cols.append(pos[i])
            vals.append(1.0)
            if j in pos and i in terms.get(j, ()) and frozenset((i, j)) not in odd:
                rows.append(pos[i])
                cols.append(pos[j])
                vals.append(-1.0)
    m = len(honest)
    mat = sp.coo_matrix((vals, (rows, cols)), shape=(m, m), dtype=np.float64).tocsr()
    mat.sum_duplicates()
    return honest, mat


# --------------------------------------------------------------------------------------------
# diag of (sigma_cdp^2 I + sigma_cor^2 M)^{-1}


def _null_components(mat: sp.csr_matrix):
    """Components of M's graph and which of them have M 1_c = 0 (module doc, Numerics)."""
    off = mat - sp.diags(mat.diagonal())
    off.eliminate_zeros()
    ncomp, labels = csgraph.connected_components(off, directed=False)
    rowsum = np.asarray(mat.sum(axis=1)).ravel()
    rowabs = np.asarray(abs(mat).sum(axis=1)).ravel()
    row_null = np.abs(rowsum) <= 8.0 * np.finfo(float).eps * rowabs
    null = np.ones(ncomp, dtype=bool)
    null[labels[~row_null]] = False
    sizes = np.bincount(labels, minlength=ncomp).astype(np.float64)
    degree = np.bincount(labels, weights=mat.diagonal(), minlength=ncomp) / sizes
    return labels, null, sizes, degree


def inverse_diagonal(sigma_cdp: float, sigma_cor: float, M, *, dense_max: int = 2000) -> np.ndarray:
    """diag of (sigma_cdp^2 I + sigma_cor^2 M)^{-1} for a symmetric PSD (Laplacian-type) M.

    Up to ``dense_max`` rows: dense Cholesky; above: sparse LU solved against blocks of
    ``SPARSE_BLOCK`` identity columns, keeping only the diagonal (memory O(n * block)). The
    exact null directions of M are deflated first, so the result is accurate for any
    sigma_cor / sigma_cdp (module doc).
    """
    a, b = _sigmas(sigma_cdp, sigma_cor)
    mat = sp.csr_matrix(M, dtype=np.float64)
    if mat.ndim != 2 or mat.shape[0] != mat.shape[1]:
        raise ValueError(f"M must be square, got shape {mat.shape}")
    m = mat.shape[0]
    if m == 0:
        return np.empty(0)
    if b == 0.0:
        return np.full(m, 1.0 / a)
    labels, null, sizes, degree = _null_components(mat)
    tau = a + b * degree  # eigenvalue the null direction 1_c gets in K, minus a
    gamma = np.where(null, tau / sizes, 0.0)  # rank-one weight of component c
    correction = np.where(null, (1.0 / a - 1.0 / (a + tau)) / sizes, 0.0)

    if m <= dense_max:
        k = mat.toarray() * b
        k[np.diag_indices(m)] += a
        g_node = gamma[labels]
        if np.any(g_node):
            same = labels[:, None] == labels[None, :]
            k += np.where(same, g_node[:, None], 0.0)
        chol, info = sla.lapack.dpotrf(k, lower=1, clean=0)
        if info != 0:
            raise ValueError("sigma_cdp^2 I + sigma_cor^2 M is not positive definite (is M PSD?)")
        inv, info = sla.lapack.dpotri(chol, lower=1)
        if info != 0:
            raise ArithmeticError(f"LAPACK dpotri failed (info = {info})")
        diag = np.diag(inv).copy()
    else:
        comps = np.flatnonzero(null)
        hub_of = np.full(len(null), -1, dtype=np.int64)
        hub_of[comps] = np.arange(len(comps))
        nodes = np.flatnonzero(null[labels])
        hubs = m + hub_of[labels[nodes]]
        w = gamma[labels[nodes]]
        size = m + len(comps)
        top = (b * mat + a * sp.identity(m, format="csr")).tocoo()
        aug = sp.coo_matrix(
            (
                np.r_[top.data, w, w, -gamma[comps]],
                (
                    np.r_[top.row, nodes, hubs, m + np.arange(len(comps))],
                    np.r_[top.col, hubs, nodes, m + np.arange(len(comps))],
                ),
            ),
            shape=(size, size),
        ).tocsc()
        # quasi-definite ([[SPD, C], [C^T, -D]]): every symmetric ordering has a stable LDL^T,
        # so a fill-reducing symmetric ordering without pivoting is safe
        lu = spla.splu(
            aug,
            permc_spec="MMD_AT_PLUS_A",
            diag_pivot_thresh=0.0,
            options={"SymmetricMode": True},
        )
        diag = np.empty(m)
        for start in range(0, m, SPARSE_BLOCK):
            stop = min(m, start + SPARSE_BLOCK)
            cols = np.arange(stop - start)
            rhs = np.zeros((size, stop - start))
            rhs[start + cols, cols] = 1.0
            diag[start:stop] = lu.solve(rhs)[start + cols, cols]
    diag += correction[labels]
    if not np.all(diag > 0):
        raise ArithmeticError("non-positive diagonal of an inverse covariance (is M PSD?)")
    return diag


# --------------------------------------------------------------------------------------------
# fault-free graphs


def graph_step_rho(
    graph: nx.Graph,
    sigma_cdp: float,
    sigma_cor: float,
    sensitivity: float,
    *,
    collusion: int = 0,
    max_coalitions: int = 20000,
    dense_max: int = 2000,
) -> np.ndarray:
    """Fault-free per-node per-round rho: for user i, the worst over |Q| = collusion, i not in Q,
    of (sensitivity^2 / 2) [(sigma_cdp^2 I + sigma_cor^2 L(G[V \\ Q]))^{-1}]_ii.

    One :func:`inverse_diagonal` per coalition (dense or sparse by ``dense_max``). Nodes must be
    labelled 0..n-1. Raises :class:`TooManyCoalitions` past ``max_coalitions``.
    """
    _sigmas(sigma_cdp, sigma_cor)
    half = _check_sensitivity(sensitivity) ** 2 / 2.0
    n, edges = _graph_edges(graph)
    q = _check_collusion(collusion, n)
    adj = _adjacency(n, edges)
    out = np.zeros(n)
    everyone = np.arange(n)
    for coalition in coalitions(n, q, max_coalitions):
        honest = np.setdiff1d(everyone, coalition)
        lap = _induced_laplacian(adj, honest)
        d = inverse_diagonal(sigma_cdp, sigma_cor, lap, dense_max=dense_max)
        out[honest] = np.maximum(out[honest], half * d)
    return out


class SpectralGraph:
    """Eigen-decompositions of L(G[V \\ Q]) for every coalition |Q| = collusion, for fast repeated
    evaluation at many (sigma_cdp, sigma_cor) pairs on one graph.

    [Sigma^{-1}]_ii = 1/(m_c sigma_cdp^2) + sum_k U_ik^2 / (sigma_cdp^2 + sigma_cor^2 lambda_k),
    the sum over the non-null eigenpairs and m_c the size of i's component of G[H] (its null
    direction written exactly, module doc). Memory:
    C(n, q) (n - q)^2 floats, refused above ``max_floats``.
    """

    def __init__(
        self,
        graph: nx.Graph,
        collusion: int = 0,
        max_coalitions: int = 20000,
        *,
        max_floats: int = 50_000_000,
    ) -> None:
        n, edges = _graph_edges(graph)
        q = _check_collusion(collusion, n)
        every = coalitions(n, q, max_coalitions)
        nh = n - q
        if len(every) * nh * nh > max_floats:
            raise ValueError(
                f"{len(every)} coalitions x {nh}^2 eigenvector entries exceed max_floats = "
                f"{max_floats}; use graph_step_rho instead"
            )
        self.n = n
        self.collusion = q
        self.coalitions = every
        adj = _adjacency(n, edges)
        everyone = np.arange(n)
        self.honest = np.empty((len(every), nh), dtype=np.int64)
        self._u2 = np.zeros((len(every), nh, nh))
        self._lam = np.zeros((len(every), nh))
        self._null = np.zeros((len(every), nh))
        for k, coalition in enumerate(every):
            honest = np.setdiff1d(everyone, coalition)
            self.honest[k] = honest
            lap = _induced_laplacian(adj, honest)
            ncomp, labels = csgraph.connected_components(adj[honest][:, honest], directed=False)
            lam, vecs = np.linalg.eigh(lap.toarray())
            top = max(1.0, float(lam[-1]))
            if np.max(np.abs(lam[:ncomp])) > 1e-8 * top or (
                ncomp < nh and lam[ncomp] <= 1e-8 * top
            ):
                raise ArithmeticError(
                    f"coalition {coalition}: the Laplacian spectrum does not separate its "
                    f"{ncomp} null eigenvalues from the rest"
                )
            u2 = vecs**2
            u2[:, :ncomp] = 0.0
            lam[:ncomp] = 0.0
            self._u2[k] = u2
            self._lam[k] = lam
            self._null[k] = 1.0 / np.bincount(labels)[labels]

    def inverse_diagonals(self, sigma_cdp: float, sigma_cor: float) -> np.ndarray:
        """(coalitions x (n - q)) array of diag Sigma_H^{-1}, columns in ``self.honest`` order."""
        a, b = _sigmas(sigma_cdp, sigma_cor)
        inv = 1.0 / (a + b * self._lam)
        return np.einsum("kij,kj->ki", self._u2, inv) + self._null / a

    def _rho(self, sigma_cdp: float, sigma_cor: float, sensitivity: float) -> np.ndarray:
        half = _check_sensitivity(sensitivity) ** 2 / 2.0
        return half * self.inverse_diagonals(sigma_cdp, sigma_cor)

    def step_rho(self, sigma_cdp: float, sigma_cor: float, sensitivity: float) -> np.ndarray:
        """Per-node worst per-round rho over the coalitions (same as :func:`graph_step_rho`)."""
        rho = self._rho(sigma_cdp, sigma_cor, sensitivity)
        out = np.zeros(self.n)
        np.maximum.at(out, self.honest.ravel(), rho.ravel())
        return out

    def worst_step_rho(self, sigma_cdp: float, sigma_cor: float, sensitivity: float) -> float:
        """max over users of :meth:`step_rho` (the quantity calibration needs)."""
        return float(self._rho(sigma_cdp, sigma_cor, sensitivity).max())

    def pairwise_rho(self, sigma_cdp: float, sigma_cor: float, sensitivity: float) -> np.ndarray:
        """collusion = 1 only: F[v, u] = per-round rho of user u against curious user v (Q = {v}),
        zero diagonal."""
        if self.collusion != 1:
            raise ValueError(f"pairwise_rho needs collusion = 1, this has {self.collusion}")
        rho = self._rho(sigma_cdp, sigma_cor, sensitivity)
        out = np.zeros((self.n, self.n))
        observers = np.array([c[0] for c in self.coalitions], dtype=np.int64)
        out[np.repeat(observers, self.n - 1), self.honest.ravel()] = rho.ravel()
        return out


def closed_form_rho(
    n: int,
    a_q: float,
    sigma_cdp: float,
    sigma_cor: float,
    sensitivity: float,
    collusion: int = 0,
) -> float:
    """Theorem 1/6 bound: (Delta^2/2) [1/((n-q) sigma_cdp^2) + (1 - 1/(n-q))/(sigma_cdp^2 + a_q
    sigma_cor^2)], with a_q = :func:`algebraic_connectivity` (or any lower bound on it).

    Per unit order: the step is (alpha, alpha * rho)-SecRDP for every alpha > 1 (a Gaussian
    view; the theorem has no condition on sigma or on the order), so any order may be used in
    the conversion."""
    a, b = _sigmas(sigma_cdp, sigma_cor)
    half = _check_sensitivity(sensitivity) ** 2 / 2.0
    h = operator.index(n) - _check_collusion(collusion, operator.index(n))
    if not (math.isfinite(a_q) and a_q >= 0):
        raise ValueError(f"a_q must be a finite non-negative number, got {a_q!r}")
    return half * (1.0 / (h * a) + (1.0 - 1.0 / h) / (a + a_q * b))


def algebraic_connectivity(
    graph: nx.Graph, collusion: int = 0, *, max_coalitions: int = 20000
) -> float:
    """a_q(G) = min over |Q| = q of lambda_2(L(G - Q)); 0 when some G - Q is disconnected.

    A single remaining vertex has no lambda_2; it contributes 0 (the closed form does not depend
    on a_q when n - q = 1).
    """
    n, edges = _graph_edges(graph)
    q = _check_collusion(collusion, n)
    adj = _adjacency(n, edges)
    everyone = np.arange(n)
    best = math.inf
    for coalition in coalitions(n, q, max_coalitions):
        honest = np.setdiff1d(everyone, coalition)
        if len(honest) < 2:
            return 0.0
        ncomp, _ = csgraph.connected_components(adj[honest][:, honest], directed=False)
        if ncomp > 1:
            return 0.0
        lap = _induced_laplacian(adj, honest).toarray()
        lam2 = sla.eigh(lap, eigvals_only=True, subset_by_index=[1, 1])[0]
        best = min(best, max(0.0, float(lam2)))
    return best


def gamma_w(W, graph: nx.Graph) -> float:
    """Gamma_W = (1/|E|) sum over edges {i, j} of ||W[:, i] - W[:, j]||^2 (Lemma 8)."""
    n, edges = _graph_edges(graph)
    w = np.asarray(W, dtype=np.float64)
    if w.shape != (n, n):
        raise ValueError(f"W must be {n} x {n}, got shape {w.shape}")
    if len(edges) == 0:
        raise ValueError("the graph has no edges")
    diff = w[:, edges[:, 0]] - w[:, edges[:, 1]]
    return float(np.einsum("ij,ij->", diff, diff) / len(edges))


# --------------------------------------------------------------------------------------------
# conversions and calibration


def conversions(rho_total: float, delta: float) -> dict:
    """(eps, delta) of a run whose per-user RDP is alpha * rho_total, three ways (module doc)."""
    eps, alpha = rdp.eps_from_rho(rho_total, delta)
    return {
        "rho": float(rho_total),
        "eps": eps,
        "alpha": alpha,
        "eps_paper": rdp.eps_mironov(rho_total, delta),
        "eps_gdp": rdp.eps_gaussian(rho_total, delta),
    }


def _eps_of(rho: float, delta: float, gaussian: bool) -> float:
    """The eps of a run whose per-user view is a Gaussian mechanism with mu^2 = 2 rho: its exact
    profile (``gaussian``), or the improved RDP conversion of its curve."""
    return rdp.eps_gaussian(rho, delta) if gaussian else rdp.eps_from_rho(rho, delta)[0]


def rho_for_eps(target_eps: float, delta: float, *, gaussian: bool = False) -> float:
    """Total rho whose eps is target_eps (bisection on log rho, relative 1e-12): by the
    improved RDP conversion, or the exact Gaussian profile with ``gaussian``. Returns the lower
    end, so the eps of the result is <= target_eps."""
    if not (math.isfinite(target_eps) and target_eps > 0):
        raise ValueError(f"target_eps must be a finite positive number, got {target_eps!r}")

    def eps(r: float) -> float:
        return _eps_of(r, delta, gaussian)

    lo = hi = 1.0
    if eps(1.0) > target_eps:
        while eps(lo) > target_eps:
            hi, lo = lo, lo / 2.0
    else:
        while eps(hi) <= target_eps:
            lo, hi = hi, hi * 2.0
    while hi / lo - 1.0 > 1e-12:
        mid = math.sqrt(lo * hi)
        if not lo < mid < hi:
            break
        if eps(mid) <= target_eps:
            lo = mid
        else:
            hi = mid
    return lo


def _smallest_sigma_cor(
    f: Callable[[float], float], target: float, sensitivity: float
) -> float | None:
    """Smallest sigma_cor >= 0 with f(sigma_cor) <= target (f non-increasing), None if even
    SIGMA_COR_MAX * sensitivity does not reach it. Relative tolerance 1e-10."""
    target = target * (1.0 + RHO_SLACK)
    if f(0.0) <= target:
        return 0.0
    lo, hi = 0.0, sensitivity
    while f(hi) > target:
        lo, hi = hi, hi * 2.0
        if hi > SIGMA_COR_MAX * sensitivity:
            return None
    for _ in range(2000):
        if hi - lo <= 1e-10 * hi:
            break
        mid = 0.5 * (lo + hi)
        if f(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def calibrate_pairs(
    step_rho_worst: Callable[[float, float], float],
    *,
    rounds: int,
    target_eps: float,
    delta: float,
    sensitivity: float,
    honest_n: int,
    grid: int = 50,
    gaussian: bool = False,
) -> dict:
    """(sigma_cdp, sigma_cor) pairs reaching target_eps after ``rounds`` rounds (App. D.1),
    target_eps measured by the exact Gaussian profile with ``gaussian``, else by the improved
    RDP conversion.

    ``step_rho_worst(sigma_cdp, sigma_cor)``: worst per-round rho over users (e.g.
    ``lambda a, b: spectral.worst_step_rho(a, b, sensitivity)``). sigma_cdp runs over
    ``linspace(sigma_CDP, sigma_LDP, grid + 1)[1:]``; for each, the smallest sigma_cor reaching the
    per-round budget (up to a relative ``RHO_SLACK`` of rounding). Grid points that cannot reach
    it are skipped with a RuntimeWarning and listed under "skipped".
    """
    rounds = operator.index(rounds)
    honest_n = operator.index(honest_n)
    grid = operator.index(grid)
    if rounds < 1 or honest_n < 1 or grid < 1:
        raise ValueError("rounds, honest_n and grid must be >= 1")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be a finite positive number, got {sensitivity!r}")
    rho_target = rho_for_eps(target_eps, delta, gaussian=gaussian)
    rho1 = rho_target / rounds
    sigma_ldp = sensitivity / math.sqrt(2.0 * rho1)
    sigma_floor = sigma_ldp / math.sqrt(honest_n)
    pairs = []
    skipped = []
    for s_cdp in np.linspace(sigma_floor, sigma_ldp, grid + 1)[1:].tolist():
        s_cor = _smallest_sigma_cor(lambda c, s=s_cdp: step_rho_worst(s, c), rho1, sensitivity)
        if s_cor is None:
            warnings.warn(
                f"sigma_cdp = {s_cdp:.6g} cannot reach the per-round rho {rho1:.6g} with "
                f"sigma_cor <= {SIGMA_COR_MAX:g} * sensitivity; grid point skipped",
                RuntimeWarning,
                stacklevel=2,
            )
            skipped.append(s_cdp)
            continue
        r = float(step_rho_worst(s_cdp, s_cor))
        pairs.append(
            {
                "sigma_cdp": s_cdp,
                "sigma_cor": s_cor,
                "rho_step": r,
                "eps": _eps_of(rounds * r, delta, gaussian),
            }
        )
    if not pairs:
        raise ValueError("no grid point reaches the target (is step_rho_worst right?)")
    return {
        "rho_target": rho_target,
        "rho_step": rho1,
        "sigma_ldp": sigma_ldp,
        "sigma_cdp_floor": sigma_floor,
        "pairs": pairs,
        "skipped": skipped,
        "low": pairs[0],
        "mid": pairs[len(pairs) // 2],
        "high": pairs[-1],
    }


def choose_pair(cal: dict, which: str) -> dict:
    """The "low" (smallest sigma_cdp), "mid" or "high" pair of :func:`calibrate_pairs`."""
    if which not in ("low", "mid", "high"):
        raise ValueError(f"which must be 'low', 'mid' or 'high', got {which!r}")
    return cal[which]
