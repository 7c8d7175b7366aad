"""Split a training set over ``n_nodes`` nodes: iid, Dirichlet label skew, or fixed-size shards.

:func:`partition` returns, per node, a sorted int64 array of indices into the training set. The
parts are pairwise disjoint. Everything is drawn from
``Generator(PCG64(SeedSequence(seed, spawn_key=(STREAM_PARTITION,))))``, so the same arguments
always give the same parts (and the stream differs from the dataset's own streams even when
the same seed is used for both).

Schemes:

* ``iid``: a uniformly random permutation of ``0..m-1`` cut into ``n_nodes`` contiguous parts of
  sizes ``floor(m/n)`` or ``ceil(m/n)`` (the first ``m mod n`` nodes get one more point). The
  parts cover every point exactly once.
* ``dirichlet``: label skew as in the federated / decentralized learning literature. For every
  class ``c`` (in increasing order) draw proportions ``p_c ~ Dirichlet(beta * 1_n)`` over the
  nodes, shuffle the points of class ``c`` and cut them at ``floor(m_c * cumsum(p_c))``, so node
  ``v`` receives about ``p_c[v] * m_c`` points of class ``c``. Small ``beta`` concentrates each
  class on a few nodes (strong skew), large ``beta`` approaches the iid split. Every point is
  assigned. Every node must get at least one point: the whole draw is repeated (continuing the
  same stream) up to ``DIRICHLET_MAX_TRIES`` times; if some node is still empty after that, the
  last draw is repaired deterministically: each empty node, in increasing id order, takes one
  point chosen uniformly at random (from the stream) from the currently largest node (lowest id
  on ties). That node has at least 2 points since ``m >= n_nodes``. Regression data
  (``n_classes == 0``) is refused: there are no labels to skew.
* ``ordered``: contiguous blocks in the dataset's order, node v gets block v (``np.array_split``
  of ``0..m-1``): for data whose rows already belong to nodes, such as ``quadratic``.
* ``fixed``: exactly ``per_node`` distinct random points per node, disjoint across nodes (the
  first ``n_nodes * per_node`` entries of a random permutation); the remaining points are unused.

``per_node`` only applies to ``fixed`` and ``beta`` / ``n_classes`` only to ``dirichlet``; they
are ignored by the other schemes.
"""

from __future__ import annotations

import math

import numpy as np

PARTITION_SCHEMES = ("iid", "dirichlet", "fixed", "ordered")

STREAM_PARTITION = 3
DIRICHLET_MAX_TRIES = 100


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def partition(
    y: np.ndarray,
    n_nodes: int,
    scheme: str = "iid",
    *,
    seed: int,
    beta: float = 1.0,
    per_node: int | None = None,
    n_classes: int = 0,
) -> list[np.ndarray]:
    """One sorted int64 index array per node (see the module docstring for the schemes).

    Raises ValueError for an unknown scheme, ``n_nodes < 1``, more nodes than points, a bad
    ``beta`` (dirichlet), a missing or too large ``per_node`` (fixed), or labels outside
    ``0..n_classes-1`` (dirichlet).
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be a 1-D array of labels or targets, got shape {y.shape}")
    m = int(y.shape[0])
    if scheme not in PARTITION_SCHEMES:
        raise ValueError(
            f"unknown partition scheme {scheme!r}; expected one of {', '.join(PARTITION_SCHEMES)}"
        )
    if not _is_int(n_nodes) or n_nodes < 1:
        raise ValueError(f"n_nodes must be an integer >= 1, got {n_nodes!r}")
    n_nodes = int(n_nodes)
    if n_nodes > m:
        raise ValueError(f"cannot give each of {n_nodes} nodes a point: only {m} training points")
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    rng = np.random.Generator(
        np.random.PCG64(np.random.SeedSequence(entropy=int(seed), spawn_key=(STREAM_PARTITION,)))
    )

    if scheme == "iid":
        parts = np.array_split(rng.permutation(m), n_nodes)
    elif scheme == "ordered":
        parts = np.array_split(np.arange(m), n_nodes)
    elif scheme == "fixed":
        if per_node is None or not _is_int(per_node) or per_node < 1:
            raise ValueError(f"scheme 'fixed' needs per_node, an integer >= 1, got {per_node!r}")
        if per_node * n_nodes > m:
            raise ValueError(
                f"scheme 'fixed': {n_nodes} nodes x {per_node} points = {per_node * n_nodes} "
                f"exceeds the {m} training points"
            )
        parts = list(rng.permutation(m)[: n_nodes * per_node].reshape(n_nodes, per_node))
    else:
        parts = _dirichlet(y, n_nodes, rng, beta, n_classes)
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _dirichlet(
    y: np.ndarray, n_nodes: int, rng: np.random.Generator, beta: float, n_classes: int
) -> list[np.ndarray]:
    if not isinstance(beta, (int, float, np.floating)) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"scheme 'dirichlet' needs beta > 0 (finite), got {beta!r}")
    if not _is_int(n_classes) or n_classes < 0:
        raise ValueError(f"n_classes must be a non-negative integer, got {n_classes!r}")
    if n_classes == 0:
        raise ValueError(
            "scheme 'dirichlet' skews the label distribution and needs classification labels: "
            "pass n_classes >= 1 (for regression data use 'iid' or 'fixed')"
        )
    bad = f"scheme 'dirichlet': labels must be integers in 0..{n_classes - 1}"
    if y.dtype.kind not in "iuf":
        raise ValueError(f"{bad}, got dtype {y.dtype}")
    if y.size:
        if y.dtype.kind == "f" and not (np.all(np.isfinite(y)) and np.all(y == np.round(y))):
            raise ValueError(bad)
        if y.min() < 0 or y.max() >= n_classes:
            raise ValueError(f"{bad}, found values in {y.min():g}..{y.max():g}")
    labels = y.astype(np.int64)
    by_class = [np.flatnonzero(labels == c) for c in range(n_classes)]
    alpha = np.full(n_nodes, float(beta))

    assign: list[list[np.ndarray]] = []
    for _ in range(DIRICHLET_MAX_TRIES):
        assign = [[] for _ in range(n_nodes)]
        for idx in by_class:
            p = rng.dirichlet(alpha)
            if not np.all(np.isfinite(p)) or p.sum() <= 0:  # extreme beta: all mass underflowed
                p = np.zeros(n_nodes)
                p[rng.integers(n_nodes)] = 1.0
            cuts = np.floor(np.cumsum(p)[:-1] * idx.size).astype(np.int64)
            cuts = np.clip(cuts, 0, idx.size)
            for v, chunk in enumerate(np.split(rng.permutation(idx), cuts)):
                assign[v].append(chunk)
        if all(sum(c.size for c in chunks) > 0 for chunks in assign):
            break
    parts = [np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64) for chunks in assign]
    # fallback (only if every try left a node empty): move single points to the empty nodes
    for v in range(n_nodes):
        if parts[v].size == 0:
            sizes = np.array([p.size for p in parts])
            donor = int(np.argmax(sizes))  # lowest id among the largest
            k = int(rng.integers(parts[donor].size))
            parts[v] = parts[donor][k : k + 1].copy()
            parts[donor] = np.delete(parts[donor], k)
    return parts
