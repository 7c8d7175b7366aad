"""The yardstick of a result: the error the noise alone would give, beside the measured one.

A measured error means little on its own (``|estimate - truth| = 85.42``: good or bad?). Every
run summary (``summary.json``, ``cfree run --json``) carries a ``yardstick`` object saying what
the protocol's noise alone, computed from the public plan, would give, so a reader sees whether
the result is what the privacy costs or something else (a fault, a consensus not yet reached,
a bug). docs/yardstick.md defines the expected value of every family:

* averaging (``muffliato``, ``randomized-gossip``): node v's final value is a fixed linear mix of
  the initial noisy values, ``x_v^T = sum_u M[v, u] (x_u + eta_u)`` with ``M`` the product of
  the plan's gossip steps (acceleration and dropout included). The noise alone gives an error of
  root-mean-square ``sigma * sqrt(dim) * ||M[v]||_2``; the expected value is its mean over the
  nodes that finished, the measured one their mean ``|estimate - mean|``.
* token sums: the noise of the token is the sum of the noise of its steps, RMS
  ``sigma * sqrt(dim * sum_s var_s)`` (``sigma * sqrt(dim * T)`` on the complete graph).
* token histograms: the debiased randomized-response counts; the squared error summed over the
  levels has expectation ``(N (1 - q) + I (1 - 1/L)) / (1 - gamma)^2``, ``q = (1 - gamma +
  gamma/L)^2 + (L - 1) (gamma/L)^2`` whatever the values (N responses, I initial items).
* private ADMM (``admm``, ``admm-central``, ``admm-federated``, ``prox-sgd``): the test objective
  of the released model (mean over the completed tokens) against that of the same run without
  noise, the trivial model ``z = 0`` beside (a model that learned nothing is far).
* learning (every model-training protocol, token walks carrying a model included): the final
  test loss against that of the same run without noise (the ``noise_free`` reference).

``ratio`` is measured / expected; ``far`` is set when it exceeds :data:`FAR` (the measured error
is then not explained by the noise alone). The keys never name a privacy loss: a yardstick is
an error, not an epsilon.
"""

from __future__ import annotations

import math

import numpy as np

#: A measured error more than this many times the expected one is flagged (``far``).
FAR = 3.0


def judge(measured: float | None, expected: float | None, **fields) -> dict:
    """``{measured, expected, ratio, far, threshold, ...fields}``; ``ratio`` is None when
    nothing was measured or the noise alone gives no error (sigma = 0)."""
    ratio = None
    if measured is not None and expected is not None and expected > 0:
        ratio = float(measured) / float(expected)
    return {
        "measured": None if measured is None else float(measured),
        "expected": None if expected is None else float(expected),
        "ratio": ratio,
        "far": ratio is not None and ratio > FAR,
        "threshold": FAR,
        **fields,
    }


# ------------------------------------------------------------------------- averaging


def _step_matrix(plan, t: int) -> np.ndarray:
    """Node values after step t as rows of weights on the values before it (a missing or
    dropped partner's weight stays with the node, as the nodes do)."""
    n = plan.n
    S = np.zeros((n, n))
    for v in range(n):
        part = set(plan.partners_at(v, t))
        for w, a in plan.row_at(v, t).items():
            S[v, w if (w == v or w in part) else v] += a
    return S


def gossip_mix(plan) -> np.ndarray:
    """``M`` (n x n): row v holds the weight of every node's initial value in v's final value
    under the fault-free plan (synchronous steps with their Chebyshev acceleration and public
    dropout, or the exchanges of a randomized-gossip schedule)."""
    n = plan.n
    M = np.eye(n)
    edges = getattr(plan, "edges", None)
    if edges is not None:  # randomized gossip: one pair averages per exchange
        for e in edges:
            M[[e.a, e.b]] = 0.5 * (M[e.a] + M[e.b])
        return M
    fixed = None if getattr(plan, "dropped", ()) else plan.W
    prev = None
    for t in range(plan.steps):
        S = fixed if fixed is not None else _step_matrix(plan, t)
        new = np.asarray(S @ M)
        g = plan.gamma_at(t)
        if g != 1.0:
            new = g * new + (1.0 - g) * prev
        prev, M = M, new
    return M


def averaging(plan, results: dict) -> dict:
    """The yardstick of a gossip-averaging run (``results``: the run's collected results)."""
    rms = plan.sigma * math.sqrt(plan.dim) * np.linalg.norm(gossip_mix(plan), axis=1)
    fin = [r for r in results["nodes"] if r.get("finished")]
    measured = float(np.mean([r["error"] for r in fin])) if fin else None
    expected = float(np.mean([rms[r["node"]] for r in fin])) if fin else float(np.mean(rms))
    return judge(
        measured,
        expected,
        quantity="mean over the nodes that finished of |estimate - true mean|",
        basis="each node's noise as the gossip mixes it, sigma * sqrt(dim) * ||M[v]||, "
        "M the product of the plan's gossip steps",
        local_noise=plan.sigma * math.sqrt(plan.dim),
    )


# ------------------------------------------------------------------------- token walks


def token_noise(plan) -> float:
    """RMS of the L2 norm of a token's summed noise (sum protocols)."""
    return plan.sigma * math.sqrt(plan.dim * float(np.sum(plan.noise_vars(plan.hops))))


def histogram_responses(plan) -> int:
    """How many randomized responses a token collects (at most, under a contribution cap on
    a random walk)."""
    return plan.hops if plan.cap == 0 else min(plan.hops, plan.n * plan.cap)


def histogram_noise(plan) -> float:
    """RMS of the L2 error of a debiased randomized-response histogram (see the module)."""
    L, g = plan.levels, plan.gamma
    if g >= 1.0:
        return math.inf
    q = (1.0 - g + g / L) ** 2 + (L - 1) * (g / L) ** 2
    var = histogram_responses(plan) * (1.0 - q) + plan.init_items * (1.0 - 1.0 / L)
    return math.sqrt(var) / (1.0 - g)


def walk(plan, results: dict) -> dict:
    """The yardstick of a sum or histogram walk: the mean error of the tokens that completed
    against the RMS error of a token's noise."""
    done = [t for t in results.get("tokens", []) if "error" in t]
    measured = float(np.mean([t["error"] for t in done])) if done else None
    if plan.kind == "sum":
        terms = float(np.sum(plan.noise_vars(plan.hops)))
        basis = f"the token's summed noise, sigma * sqrt(dim * {terms:g} noise terms)"
        expected = token_noise(plan)
    else:
        basis = (
            f"the debiased randomized response at gamma = {plan.gamma:.4g} over {plan.levels} levels, "
            f"{histogram_responses(plan)} responses (+ {plan.init_items} initial items)"
        )
        expected = histogram_noise(plan)
    return judge(
        measured,
        expected,
        quantity="mean over the completed tokens of |estimate - truth|",
        basis=basis,
    )


# ------------------------------------------------------------------------- private ADMM


def admm(measured: float | None, reference: dict | None) -> dict | None:
    """The yardstick of a private-ADMM run: the released model's test objective (mean loss +
    regulariser on the test set) against the same run without noise, the trivial model z = 0
    beside (``reference``: ``families/admm/render.references``)."""
    if not reference:
        return None
    nf, tr = reference["noise_free"], reference["trivial"]
    return judge(
        measured,
        nf["test_loss"],
        kind="test-objective",
        quantity="test objective (mean loss + regulariser on the test set) of the released model, "
        "mean over the completed tokens",
        basis="the same run without noise (sigma = 0)",
        trivial=tr["test_loss"],
        noise_free_gap=nf.get("objective_gap"),
    )


# ------------------------------------------------------------------------- learning


def learning(measured_loss: float | None, measured_acc, reference: dict | None) -> dict | None:
    """The yardstick of a trained model: its final test loss against the noise-free
    reference's (``reference``: families/learning/reference.py), with the accuracies beside."""
    if not reference:
        return None
    nf, tr = reference["noise_free"], reference["trivial"]
    out = judge(
        measured_loss,
        nf["test_loss"],
        quantity="test loss of the final model",
        basis="the same run without noise (sigma = 0)",
        trivial=tr["test_loss"],
    )
    if measured_acc is not None or nf.get("test_accuracy") is not None:
        out["accuracy"] = {
            "measured": measured_acc,
            "noise_free": nf.get("test_accuracy"),
            "trivial": tr.get("test_accuracy"),
        }
    return out


# ------------------------------------------------------------------------- for people


def lines(y: dict | None) -> list[str]:
    """The yardstick said in one or two lines (nothing when there is none)."""
    if not y:
        return []
    from coordinator_free.accounting.render import fmt

    if y["measured"] is None:
        return [f"yardstick: nothing measured; the noise alone gives {fmt(y['expected'])}"]
    learning_ = "trivial" in y
    if y.get("kind") == "test-objective":
        head = (
            f"yardstick: test objective {fmt(y['measured'])} against {fmt(y['expected'])} "
            f"without noise (trivial model z = 0: {fmt(y['trivial'])})"
        )
    elif learning_:
        head = (
            f"yardstick: test loss {fmt(y['measured'])} against {fmt(y['expected'])} without "
            f"noise (trivial model: {fmt(y['trivial'])})"
        )
    else:
        head = (
            f"yardstick: measured error {fmt(y['measured'])} against {fmt(y['expected'])} "
            f"that the noise alone gives (root mean square of {y['basis']})"
        )
    if y["ratio"] is None:
        return _wrap(head + "; no noise, so no ratio")
    out = _wrap(f"{head}; ratio {y['ratio']:.2f}")
    if y["far"]:
        why = (
            "the noise costs the model much more than its own loss without noise"
            if learning_
            else "something besides the noise (faults, gossip not yet mixed) is in the error"
        )
        out += _wrap(f"FAR OUTSIDE the yardstick (ratio > {y['threshold']:g}): {why}", "  ")
    return out


def _wrap(text: str, first: str = "") -> list[str]:
    """A line of the run summary, wrapped as its other sentences are (100 columns)."""
    import textwrap

    return textwrap.wrap(text, 100, initial_indent=first, subsequent_indent="  ")
