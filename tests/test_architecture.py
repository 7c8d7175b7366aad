"""The package's structure, checked: every protocol reached through the family registry, no
module outside ``families/`` deciding by protocol name, ``engine/`` importing no family, and no
import cycle anywhere (counting the package ``__init__`` modules an import runs)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

import coordinator_free
from coordinator_free.families import catalog, family_of, protocol_names

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


def _imports(module: str, path: Path, *, type_checking: bool = False) -> set[str]:
    """The package modules ``module`` imports, at module level or inside functions (imports
    under ``if TYPE_CHECKING:`` excluded unless ``type_checking``): ``from a.b import c`` is an
    edge to ``a.b.c`` when that is a module, else to ``a.b``; relative imports are resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if not type_checking and isinstance(node, ast.If) and _is_type_checking(node):
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


def _packages_above(module: str) -> list[str]:
    """The packages whose ``__init__`` runs before ``module``: ``a.b.c`` -> ``a``, ``a.b``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph() -> nx.DiGraph:
    """Module -> the modules it imports, as they run: importing ``a.b.c`` runs ``a/__init__``
    and ``a/b/__init__`` first, so the importer also has an edge to every package above its
    target (but the packages above the importer itself, already running when it runs); a
    package's edges are those of its ``__init__``."""
    g = nx.DiGraph()
    for module, path in MODULES.items():
        g.add_node(module)
        for dep in _imports(module, path):
            _add_import(g, module, dep)
    return g


def _add_import(g: nx.DiGraph, module: str, dep: str) -> None:
    g.add_edge(module, dep)
    own = _packages_above(module)
    for pkg in _packages_above(dep):
        if pkg != module and pkg not in own:
            g.add_edge(module, pkg)


def test_the_import_graph_finds_the_edges_it_should():
    g = import_graph()
    assert g.has_edge("coordinator_free.accounting.audit", "coordinator_free.families")
    assert g.has_edge("coordinator_free.cli.plan", "coordinator_free.config")
    assert g.has_edge("coordinator_free.cli", "coordinator_free.cli.lab")
    # importing families.walk.protocol runs families/walk/__init__.py first
    assert g.has_edge(
        "coordinator_free.families.walk.node", "coordinator_free.families.walk.protocol"
    )
    assert g.has_edge("coordinator_free.sim", "coordinator_free.families.averaging")
    # not the packages above the importer: they are running already
    assert not g.has_edge("coordinator_free.families.walk.node", "coordinator_free.families.walk")
    assert len(g.edges) > 100


def _knots(g: nx.DiGraph) -> list[set[str]]:
    """The import cycles as strongly connected components (every module of one reaches every
    other), largest first."""
    return sorted((c for c in nx.strongly_connected_components(g) if len(c) > 1), key=len)[::-1]


def _describe(knots: list[set[str]]) -> str:
    return "\n".join(f"{len(k)} modules: {', '.join(sorted(k))}" for k in knots)


def test_the_cycle_finder_counts_package_inits():
    """A cycle through a package ``__init__`` only (a.x imports b.y, b/__init__ imports a.z,
    whose package a/__init__ imports a.x) is a cycle."""
    g = nx.DiGraph()
    _add_import(g, "p.a.x", "p.b.y")
    _add_import(g, "p.b", "p.a.z")
    _add_import(g, "p.a", "p.a.x")
    assert _knots(g) == [{"p.a", "p.a.x", "p.b"}]


def test_no_import_cycles():
    """No import cycle anywhere, counting package ``__init__`` edges and imports inside
    functions."""
    knots = _knots(import_graph())
    assert not knots, "import cycle(s):\n" + _describe(knots)


def test_engine_imports_no_family():
    """engine/ is the machinery below the families: a family hands it its rules (a step
    engine's program, a token engine's TokenRules); it never imports one, lazily or for type
    checking."""
    found = [
        f"{module} imports {dep}"
        for module, path in MODULES.items()
        if module.startswith("coordinator_free.engine")
        for dep in _imports(module, path, type_checking=True)
        if dep == "coordinator_free.families" or dep.startswith("coordinator_free.families.")
    ]
    assert not found, "\n".join(found)


# ------------------------------------------------------------------ no protocol-name decisions

PROTOCOL_NAMES = set(protocol_names())
#: The catalog's tuples of protocol names (``catalog.NO_NOISE``, ``WALK``, ...): a test against
#: one is a decision by protocol name under another name. ``ALL`` is not one: membership in it
#: asks whether a name is a protocol at all, which decides nothing per protocol.
CATALOG_TUPLES = {
    key
    for key, value in vars(catalog).items()
    if isinstance(value, tuple) and value and set(value) <= PROTOCOL_NAMES and key != "ALL"
}


def _protocolish(node: ast.AST) -> bool:
    """A protocol name, ``....protocol.name``, ``plan.protocol``, ``rep["protocol"]``, one of
    the ``*_PROTOCOLS`` tuples or a catalog tuple (``catalog.NO_NOISE``, ``WALK``)."""
    if isinstance(node, ast.Constant) and node.value in PROTOCOL_NAMES:
        return True
    if isinstance(node, ast.Attribute):
        if node.attr == "name" and isinstance(node.value, ast.Attribute):
            return node.value.attr == "protocol"
        if node.attr == "protocol" or node.attr.endswith("_PROTOCOLS"):
            return True
        if node.attr in CATALOG_TUPLES:
            return True
    if isinstance(node, ast.Name) and (node.id.endswith("_PROTOCOLS") or node.id in CATALOG_TUPLES):
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
        "if pr.name in catalog.NO_NOISE: pass\n"
        "if name not in WALK: pass\n"
        "if pr.name not in catalog.ALL: pass\n"
    )
    tmp = PKG.parent / "tests" / "_decisions_sample.py"
    try:
        tmp.write_text(src)
        assert len(protocol_decisions(tmp)) == 8
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


def test_no_test_module_imports_another():
    """What test modules share lives in helper modules beside them (memcases.py, ci.py, ...)
    or in conftest.py fixtures: a test module importing another runs and collects it twice."""
    found = []
    for path in sorted((PKG.parent / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            found += [
                f"{path.name}:{node.lineno}: {n}"
                for n in names
                if n.split(".")[-1].startswith("test_")
            ]
    assert not found, "\n".join(found)
