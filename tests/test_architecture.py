"""The package's structure, checked: every protocol reached through the family registry, no
module outside ``families/`` deciding by protocol name, and no import cycle anywhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

import coordinator_free
from coordinator_free.families import family_of, protocol_names

PKG = Path(coordinator_free.__file__).resolve().parent
DOCS = PKG.parent / "docs"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


# ------------------------------------------------------------------------------ the registry


def documented_protocols() -> list[str]:
    """The protocol names docs/config.md lists in the row of ``protocol.name``."""
    text = (DOCS / "config.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `name` | string |"))
    meaning = row.split("|")[4]
    return re.findall(r"`([a-z][a-z-]+)`", meaning)


def test_every_documented_protocol_has_a_family_and_every_family_protocol_is_documented():
    documented = documented_protocols()
    assert len(documented) >= 13
    for name in documented:
        fam = family_of(name)
        assert name in fam.protocols
    assert set(protocol_names()) == set(documented)


def test_an_unknown_protocol_is_named_with_the_choices():
    with pytest.raises(KeyError, match="unknown protocol 'gossip'.*muffliato"):
        family_of("gossip")


# ------------------------------------------------------------------------------ import graph


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path) -> set[str]:
    """The package modules ``module`` imports, at module level or inside functions (imports
    under ``if TYPE_CHECKING:`` excluded): ``from a.b import c`` is an edge to ``a.b.c`` when
    that is a module, else to ``a.b``; relative imports are resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "coordinator_free":
                    out.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "coordinator_free":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in MODULES else target)
    return {m for m in out if m in MODULES and m != module}


def import_graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for module, path in MODULES.items():
        g.add_node(module)
        for dep in _imports(module, path):
            g.add_edge(module, dep)
    return g


def test_the_import_graph_finds_the_edges_it_should():
    g = import_graph()
    assert g.has_edge("coordinator_free.accounting.audit", "coordinator_free.families")
    assert g.has_edge("coordinator_free.cli.plan", "coordinator_free.config")
    assert g.has_edge("coordinator_free.cli", "coordinator_free.cli.lab")
    assert len(g.edges) > 100


def test_no_import_cycles():
    cycles = sorted(nx.simple_cycles(import_graph()), key=len)
    assert not cycles, "import cycle(s):\n" + "\n".join(
        " -> ".join([*c, c[0]]) for c in cycles[:10]
    )


# ------------------------------------------------------------------ no protocol-name decisions

PROTOCOL_NAMES = set(protocol_names())


def _protocolish(node: ast.AST) -> bool:
    """A protocol name, ``....protocol.name``, ``plan.protocol``, ``rep["protocol"]`` or one of
    the ``*_PROTOCOLS`` tuples."""
    if isinstance(node, ast.Constant) and node.value in PROTOCOL_NAMES:
        return True
    if isinstance(node, ast.Attribute):
        if node.attr == "name" and isinstance(node.value, ast.Attribute):
            return node.value.attr == "protocol"
        if node.attr == "protocol" or node.attr.endswith("_PROTOCOLS"):
            return True
    if isinstance(node, ast.Name) and node.id.endswith("_PROTOCOLS"):
        return True
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value == "protocol"
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_protocolish(e) for e in node.elts)
    return False


def protocol_decisions(path: Path) -> list[str]:
    """Comparisons of protocol names and isinstance tests against plan classes in a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            if any(_protocolish(x) for x in [node.left, *node.comparators]):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
        ):
            names = [ast.unparse(node.args[1])]
            if any(re.search(r"Plan\b", n) for n in names):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_protocol_decision_finder_finds_decisions():
    src = (
        "if cfg.protocol.name == 'decor': pass\n"
        "if plan.protocol in ('dsgd', 'central-dp'): pass\n"
        "if rep['protocol'] == x: pass\n"
        "if name in LEARNING_PROTOCOLS: pass\n"
        "if isinstance(plan, rg.RandomizedPlan): pass\n"
        "if 'walk-sgd' != y: pass\n"
        "if cfg.protocol.clip == 1: pass\n"
    )
    tmp = PKG.parent / "tests" / "_decisions_sample.py"
    try:
        tmp.write_text(src)
        assert len(protocol_decisions(tmp)) == 6
    finally:
        tmp.unlink()


def test_no_module_outside_families_decides_by_protocol_name():
    families = PKG / "families"
    found = []
    for path in MODULES.values():
        if families in path.parents:
            continue
        found += [f"{path.relative_to(PKG)}: {d}" for d in protocol_decisions(path)]
    assert not found, "decisions by protocol name outside families/ (ask the family):\n" + (
        "\n".join(found)
    )


def test_every_family_renders_everything_the_cli_prints():
    """The rendering functions are named by module strings (``render_module``,
    ``render_from``): each must resolve, for every family, to a function."""
    functions = (
        "print_plan", "print_audit", "print_audit_compact", "print_calibration",
        "print_summary", "simulator_diff", "simulation", "print_simulation",
    )  # fmt: skip
    for name in protocol_names():
        fam = family_of(name)
        for function in functions:
            assert callable(fam._render(function)), (name, function)
