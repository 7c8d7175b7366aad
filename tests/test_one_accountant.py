"""Every epsilon the project prints is made by the one accountant (``coordinator_free/accounting``,
over the pure mathematics of ``coordinator_free/privacy``): a scan of every other module for a
figure of its own making, and the typed loss's own rules."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import numpy as np
import pytest

import coordinator_free
from coordinator_free.accounting import loss
from coordinator_free.privacy import rdp

PKG = Path(coordinator_free.__file__).resolve().parent
#: Where epsilons are made: the accountant, and the mathematics it is built on.
MAKERS = ("accounting", "privacy")
#: The conversions of privacy.rdp: calling one outside the accountant makes an eps of its own.
CONVERSIONS = {
    "eps_from_rho",
    "eps_from_rho_restricted",
    "eps_from_rdp_curve",
    "eps_gaussian",
    "eps_mironov",
    "delta_gaussian",
}
#: A report key that carries an epsilon (eps, eps_max, eps_usable, per_node_eps...).
EPS_KEY = re.compile(r"(^|_)eps($|_)")


def _modules() -> list[Path]:
    return [p for p in sorted(PKG.rglob("*.py")) if p.relative_to(PKG).parts[0] not in MAKERS]


def _is_copy(node: ast.AST, accountant: set[str] = frozenset()) -> bool:
    """A value read from a loss the accountant made (``entry["eps"]``, ``loss.eps``,
    ``float(entry["eps"])``), what one of its functions returns (``accountant``: the names the
    module imports from ``coordinator_free.accounting``), or None: passing a figure on, not
    making one."""
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    if isinstance(node, ast.Call):
        root = node.func
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in accountant:
            return True
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "float" and len(node.args) == 1:
        node = node.args[0]
    if not isinstance(node, ast.Subscript | ast.Attribute):
        return False
    while isinstance(node, ast.Subscript | ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)  # not a call's result: eps_from_rho(...)[0] is made


def _eps_key(node: ast.AST | None) -> bool:
    """A key that carries a loss (a ``target_eps`` is what a user asks for, not a loss)."""
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and bool(EPS_KEY.search(node.value))
        and not node.value.startswith("target")
    )


def violations(path: Path, where: str | None = None) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = where or str(path.relative_to(PKG.parent))
    accountant = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("coordinator_free.accounting")
        for a in node.names
    }
    out = []
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom) and node.module == "coordinator_free.privacy.rdp":
            out += [f"{line} imports {a.name} from privacy.rdp" for a in node.names]
        if isinstance(node, ast.Attribute) and node.attr in CONVERSIONS:
            out.append(f"{line} calls the conversion {node.attr}")
        if isinstance(node, ast.Name) and node.id in CONVERSIONS:
            out.append(f"{line} calls the conversion {node.id}")
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if _eps_key(k) and not _is_copy(v, accountant):
                    out.append(f"{line} builds {k.value!r} itself")
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if (
                    isinstance(t, ast.Subscript)
                    and _eps_key(t.slice)
                    and not _is_copy(node.value, accountant)
                ):
                    out.append(f"{line} assigns {t.slice.value!r} itself")
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                key = ast.Constant(kw.arg)
                if kw.arg and _eps_key(key) and not _is_copy(kw.value, accountant):
                    fn = ast.unparse(node.func)
                    # keyword arguments of the accountant's own constructors are its inputs
                    if not fn.endswith((".entry", "eps_only", "theorem")):
                        out.append(f"{line} passes {kw.arg}= to {fn}")
    return out


def test_no_module_outside_the_accountant_makes_an_epsilon():
    found = [v for p in _modules() for v in violations(p)]
    assert not found, "epsilons made outside accounting/:\n  " + "\n  ".join(found)


def test_the_scan_catches_a_figure_of_its_own(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text(
        "from coordinator_free.privacy.rdp import eps_from_rho\n"
        "def f(rho, d, target_eps):\n"
        "    x = {'eps': eps_from_rho(rho, d)[0], 'eps_max': 1.0 * rho}\n"
        "    x['eps_usable'] = min(x['eps'], 2.0)\n"
        "    x.update(eps=rho)\n"
        "    return x, {'eps': x['eps'], 'eps_rdp': float(x['eps']), 'target_eps': target_eps}\n"
    )
    got = violations(bad, "probe.py")
    # the import, the call, two made keys, the assignment, the keyword; line 6 only copies
    assert len(got) == 6, got
    assert not any(g.startswith("probe.py:6") for g in got), got


# ------------------------------------------------------------------------------ the typed loss


@pytest.mark.parametrize("factor", [0.0, 1e-3, 0.3, 1.0, 7.5])
def test_exact_is_the_gaussian_profile_and_never_above_the_rdp_conversion(factor):
    u = loss.Units(alpha=2.0, delta=1e-5, sensitivity=1.0, sigma=1.0)
    g = u.gaussian(factor)
    rho = factor * 0.5
    assert g.conversion == "gaussian"
    assert g.eps == (rdp.eps_gaussian(rho, 1e-5) if rho else 0.0)
    assert g.eps_rdp == (rdp.eps_from_rho(rho, 1e-5)[0] if rho else 0.0)
    assert g.eps <= g.eps_rdp
    b = u.rdp_bound(factor)
    assert (b.conversion, b.eps, b.eps_rdp) == ("rdp", g.eps_rdp, None)
    assert g.rdp == b.rdp == 2.0 * rho


def test_default_distance_one_exact_eps():
    # sigma = Delta = 1, delta = 1e-5: one Gaussian mechanism with mu = 1
    g = loss.Units(alpha=2.0, delta=1e-5, sensitivity=1.0, sigma=1.0).gaussian(1.0)
    assert g.eps == pytest.approx(4.3772, abs=5e-5)
    assert g.eps_rdp == pytest.approx(4.7284, abs=5e-5)


def test_a_theorem_is_converted_at_its_orders_only():
    u = loss.Units(alpha=2.0, delta=1e-5, sensitivity=2.0, sigma=4.0)
    t = loss.theorem(u, 0.8896, 3.372, cap=4.0113)
    assert t.conversion == "rdp-orders" and t.extra["alpha"] <= 3.372
    assert t.eps == pytest.approx(rdp.eps_from_rho_restricted(0.8896 * 0.125, 1e-5, 3.372)[0])
    assert t.eps > u.rdp_bound(0.8896).eps  # the unrestricted optimum sits beyond the condition
    assert t.extra["eps_usable"] == min(t.eps, 4.0113)
    none = loss.theorem(u, 0.5, 1.0, cap=4.0)
    assert none.eps is None and none.extra["eps_usable"] == 4.0 and none.rdp is None


def test_at_least_raises_every_loss_key_and_keeps_eps_only_bounds():
    low = {
        "source": 1,
        "factor": 0.2,
        "rdp": 0.2,
        "eps": 1.0,
        "eps_rdp": 1.2,
        "conversion": "gaussian",
    }
    cap = {"factor": 1.0, "rdp": 1.0, "eps": 4.3, "eps_rdp": 4.7, "conversion": "gaussian"}
    got = loss.at_least(low, cap)
    assert got == {**low, "factor": 1.0, "rdp": 1.0, "eps": 4.3, "eps_rdp": 4.7}
    only = loss.eps_only(2.0).entry()
    assert loss.at_least(only, cap) == {
        **only,
        "eps": 4.3,
        "eps_rdp": 4.7,
        "conversion": "gaussian",
    }
    nan = {**low, "eps": math.nan}
    assert loss.at_least(nan, cap)["eps"] == 4.3
    # A floor that is an upper bound (an exact row with an ambiguous direction kept) marks
    # what it raised, and only that.
    upper = {**cap, "upper_bound": True}
    assert loss.at_least(low, upper)["upper_bound"] is True
    high = {**low, "factor": 2.0, "rdp": 2.0, "eps": 9.0}
    assert "upper_bound" not in loss.at_least(high, upper)


def test_conversions_warmed_ahead_are_the_same_bits_and_leave_nothing_behind(monkeypatch):
    # loss.warmed: many distinct curves converted ahead in forked children, by the same
    # functions: every figure as computed at its call, and the table is empty afterwards.
    import os

    from coordinator_free import forkwork
    from coordinator_free.accounting import loss as loss_mod

    monkeypatch.setattr(forkwork, "cores", lambda: 2)  # children even on a one-core machine
    delta = 1e-5
    rhos = [0.0, *np.linspace(1e-4, 3.0, 40).tolist(), float("inf")]
    monkeypatch.setattr(loss_mod, "WARM_MIN", 10)
    monkeypatch.setattr(loss_mod, "_WARM_TASK", 7)
    fresh = {(g, r): (loss_mod._eps_gaussian_searched if g else loss_mod._eps_rdp_searched)(r, delta)
             for g in (True, False) for r in rhos}  # fmt: skip
    searched = []
    for name in ("_eps_gaussian_searched", "_eps_rdp_searched"):
        inner = getattr(loss_mod, name)
        monkeypatch.setattr(loss_mod, name,
                            lambda r, d, inner=inner: (searched.append(os.getpid()), inner(r, d))[1])  # fmt: skip
    with loss_mod.warmed(rhos, rhos, delta):
        assert len(loss_mod._WARM) == 2 * len(rhos)
        for (g, r), eps in fresh.items():
            got = loss_mod._eps_gaussian(r, delta) if g else loss_mod._eps_rdp(r, delta)
            assert got == eps or (math.isnan(got) and math.isnan(eps))
    assert searched == []  # every one was known ahead: no search in this process
    assert loss_mod._WARM == {}
    # Few curves: nothing is computed ahead.
    monkeypatch.setattr(loss_mod, "WARM_MIN", 10_000)
    with loss_mod.warmed(rhos, rhos, delta):
        assert loss_mod._WARM == {}
