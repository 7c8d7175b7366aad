"""The floor as a property: whatever happens to a run's view logs, no epsilon in any output is
below the fault-free plan's, for every protocol.

For each protocol (one small config each) one fault-free in-memory run is written as a run
directory (tests/memrun.py). Then each node's log is damaged in turn (deleted, truncated at a
record boundary, truncated at a random offset, random bytes flipped; seeded), and all logs at
once are cut at half (an interrupted run). After each damage every epsilon of every output is
collected and compared, like with like, with the plan (``cfree plan --json`` computed in
process):

* ``audit_run`` JSON: each (observer, source, method) entry against the plan's pair, and every
  other numeric value under a key starting with ``eps`` against the plan's value at the same
  path (``secldp.exact.eps``, ``ldp.eps``, ...); the audit's worst pair per method against the
  plan's ``worst_pair``;
* the coalition audit (``cfree audit --observers``: the family's ``coalition_audit``) against
  ``coalition_plan``, source by source, for a coalition holding the damaged node and one not;
* the report's data (``report.load_audit`` of the saved ``audit.json``: the pairs and the
  matrix the PNGs plot);
* the HTML page (``report.render_report(html="only")``): every heat-map cell, the headline
  "worst pairwise" figure, the central-DP figure, and the count of pairs "below" the plan.

A NaN or None epsilon is a failure unless the output gives a reason next to it. The numbers
kept under ``from_logs`` (what the replay itself computed before the floor raised the entry)
are labelled as such and are not compared. The HTML prints rounded numbers (6 significant
digits in a cell, 4 in the headline): those are compared with half a unit of their last digit
of slack on top of the relative 1e-9.

Every failing (protocol, damage, output, key) is listed with both values in the message.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from logfuzz import Log
from memrun import write_run_dir
from netrun import sigint_default

from coordinator_free import config, htmlreport, report, rundir
from coordinator_free.accounting import audit
from coordinator_free.families import catalog, family_of
from coordinator_free.inmemory import run_config

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
REL = 1e-9

#: One small config per protocol: few nodes, few steps, with pairs below local DP so that a
#: lowered loss would show.
CONFIGS = {
    "muffliato": (None, ["graph.kind=ring", "graph.nodes=6", "protocol.steps=3"]),
    "randomized-gossip": (EX / "randomized-gossip-ring.toml", ["graph.nodes=5", "protocol.steps=14"]),
    "muffliato-gd": (
        EX / "muffliato-gd-breast-cancer.toml",
        ["graph.kind=ring", "graph.nodes=6", "protocol.rounds=2", "protocol.gossip_steps=1",
         "protocol.accelerated=false"],
    ),
    "muffliato-sgd": (
        EX / "muffliato-gd-breast-cancer.toml",
        ["protocol.name=muffliato-sgd", "protocol.batch_size=8", "graph.kind=ring", "graph.nodes=5",
         "protocol.rounds=2", "protocol.gossip_steps=1", "protocol.accelerated=false"],
    ),
    "dsgd": (EX / "dsgd-breast-cancer.toml", ["graph.nodes=5", "protocol.rounds=3"]),
    "central-dp": (EX / "central-dp-breast-cancer.toml", ["graph.nodes=4", "protocol.rounds=3"]),
    "decor": (EX / "decor-ring.toml", ["graph.nodes=5", "protocol.rounds=4"]),
    "ring-sum": (EX / "ring-sum.toml", ["graph.nodes=5", "protocol.cycles=2"]),
    "ring-histogram": (EX / "ring-histogram.toml", ["graph.nodes=5", "protocol.cycles=2"]),
    "complete-sum": (EX / "complete-sum.toml", ["graph.nodes=5", "protocol.hops=20"]),
    "complete-histogram": (EX / "complete-histogram.toml", ["graph.nodes=5", "protocol.hops=20"]),
    "complete-sgd": (EX / "complete-sgd.toml", ["graph.nodes=5", "protocol.hops=20"]),
    "walk-sgd": (EX / "walk-sgd.toml", ["graph.dim=2", "protocol.hops=16"]),
    "admm": (EX / "admm-lasso.toml", ["graph.nodes=5", "protocol.hops=20", "data.samples=200",
                                      "data.features=8"]),
    **{
        name: (EX / "admm-lasso.toml", [f"protocol.name={name}", "protocol.hops=auto",
                                        "protocol.rounds=3", "graph.nodes=4", "data.samples=200",
                                        "data.features=8", "privacy.unit=user"])
        for name in ("admm-central", "admm-federated")
    },
    "prox-sgd": (EX / "prox-sgd-lasso.toml", ["protocol.rounds=3", "graph.nodes=4",
                                              "data.samples=200", "data.features=8"]),
}  # fmt: skip

DAMAGES = ("delete", "truncate-boundary", "truncate-random", "flip", "all-half")


def test_every_protocol_has_a_config():
    assert set(CONFIGS) == set(catalog.ALL)


# ------------------------------------------------------------------------------ the plan


def _flat(d, path: str = "", out: dict | None = None) -> dict[str, object]:
    """path -> value of every leaf whose key starts with ``eps`` (lists by index), skipping
    the per-pair lists (compared pair by pair) and ``from_logs`` (the replay's own numbers,
    labelled as raised)."""
    out = {} if out is None else out
    if isinstance(d, dict):
        for k, v in d.items():
            if k in ("observers", "losses", "from_logs"):
                continue
            p = f"{path}.{k}" if path else str(k)
            if isinstance(v, dict | list):
                _flat(v, p, out)
            elif str(k).startswith("eps"):
                out[p] = v
    elif isinstance(d, list):
        for i, v in enumerate(d):
            _flat(v, f"{path}[{i}]", out)
    return out


@dataclass
class Plan:
    cfg: object
    plan: object
    fam: object
    n: int
    pairs: dict[tuple[int, int, str], float]  # (observer, source, method) -> eps
    headlines: dict[str, float]  # path in the exact plan report -> eps
    worst: dict[str, float]  # method -> worst_pair.eps
    coalitions: dict[tuple[int, ...], dict[int, float]] = field(default_factory=dict)


def make_plan(name: str) -> Plan:
    path, sets = CONFIGS[name]
    return plan_of(config.load(path, [*sets, "network.deadline_s=1"]))


def plan_of(cfg) -> Plan:
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    n = plan.n
    pairs: dict[tuple[int, int, str], float] = {}
    # What `cfree plan --source U --json` gives, pair by pair, where the report lists pairs...
    for m in audit.METHODS:
        for u in range(n):
            try:
                rep = audit.plan_report(cfg, source=u, method=m)
            except Exception:
                break
            for x in rep.get("losses") or []:
                if "observer" in x and x["observer"] != u:
                    pairs[(x["observer"], u, m)] = x["eps"]
    # ... and what the family floors an audit at: the larger if both exist (like the user
    # would read the larger in either output).
    per = fam.planned_losses(cfg, plan, list(range(n)))
    for v, d in per.items():
        for (u, m), p in d.items():
            k = (v, u, m)
            pairs[k] = p["eps"] if k not in pairs else max(pairs[k], p["eps"])
    headlines: dict[str, float] = {}
    worst: dict[str, float] = {}
    for m in audit.METHODS:
        rep = audit.plan_report(cfg, source=None, method=m)
        flat = _flat(rep)
        if m == "exact":
            headlines = {k: v for k, v in flat.items() if _num(v)}
        if _num((rep.get("worst_pair") or {}).get("eps")):
            worst[m] = rep["worst_pair"]["eps"]
    return Plan(cfg, plan, fam, n, pairs, headlines, worst)


def coalition_floor(p: Plan, members: tuple[int, ...]) -> dict[int, float] | None:
    if members not in p.coalitions:
        try:
            rep = p.fam.coalition_plan(p.cfg, p.plan, list(members))
        except NotImplementedError:
            return None
        p.coalitions[members] = {r["source"]: r["eps"] for r in rep["losses"]}
    return p.coalitions[members]


def _num(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x)


def below(got, want: float, slack: float = 0.0) -> bool:
    """Whether ``got`` under-reports ``want`` (NaN, None, a string: yes)."""
    if not _num(got):
        return True
    return got < want - abs(want) * REL - slack


# ------------------------------------------------------------------------------ the runs


@dataclass
class Base:
    name: str
    run: Path
    plan: Plan
    raw: dict[int, bytes]


_BASES: dict[str, Base] = {}


def base_run(name: str, root: Path) -> Base:
    if name not in _BASES:
        p = make_plan(name)
        out = root / name
        if p.fam.has_peers(p.cfg):
            write_run_dir(p.cfg, run_config(p.cfg, seed=1), out)
        else:  # the trusted curator: a run directory with its config and no view logs
            rundir.make_dirs(out)
            rundir.config_path(out).write_text(p.cfg.to_toml())
        raw = {int(f.stem.split("-")[1]): f.read_bytes() for f in rundir.view_logs(out)}
        _BASES[name] = Base(name, out, p, raw)
    return _BASES[name]


@pytest.fixture(scope="module")
def bases_root(tmp_path_factory) -> Path:
    _BASES.clear()
    return tmp_path_factory.mktemp("floor-bases")


def damages(b: Base, kind: str, rng: random.Random, many: bool) -> list[tuple[str, dict]]:
    """(label, {node: new bytes or None for deleted}) for one kind of damage."""
    out = []
    if kind == "all-half":
        half = {}
        for v, raw in b.raw.items():
            bounds = Log.parse(raw).boundaries()
            half[v] = raw[: bounds[len(bounds) // 2]]
        out.append(("every log cut at its middle record boundary", half))
        if many:
            out.append(
                ("every log cut at half its bytes", {v: r[: len(r) // 2] for v, r in b.raw.items()})
            )
        return out
    for v, raw in sorted(b.raw.items()):
        if kind == "delete":
            out.append((f"node {v}: log deleted", {v: None}))
        elif kind == "truncate-boundary":
            bounds = Log.parse(raw).boundaries()[:-1]  # the end of the file is no truncation
            k = len(bounds)
            picks = sorted(
                {1, k // 2, k - 1} | ({1 + i * (k - 2) // 11 for i in range(12)} if many else set())
            )
            for i in picks:
                if 0 < i < len(bounds):
                    out.append(
                        (
                            f"node {v}: cut at record boundary {i}/{len(bounds)} (byte {bounds[i]})",
                            {v: raw[: bounds[i]]},
                        )
                    )
        elif kind == "truncate-random":
            for _ in range(8 if many else 1):
                k = rng.randrange(len(raw))
                out.append((f"node {v}: cut at byte {k}/{len(raw)}", {v: raw[:k]}))
        elif kind == "flip":
            for _ in range(8 if many else 1):
                data = bytearray(raw)
                spots = sorted(rng.randrange(len(raw)) for _ in range(rng.choice((1, 2, 4))))
                for i in spots:
                    data[i] ^= rng.randrange(1, 256)
                out.append((f"node {v}: bytes flipped at {spots}", {v: bytes(data)}))
    return out  # fmt: skip


# ------------------------------------------------------------------------------ the checks


def _exc(exc: Exception, run: Path) -> str:
    return f"{type(exc).__name__}: {str(exc).replace(str(run), 'RUN')}"


class Findings(list):
    def add(self, damage: str, output: str, key: str, got, want) -> None:
        self.append(f"[{damage}] {output} {key}: {got!r} < plan {want!r}")


def check_audit(p: Plan, rep: dict, damage: str, f: Findings, out: str = "audit_run JSON") -> None:
    got: dict[tuple[int, int, str], dict] = {}
    for o in rep.get("observers", []):
        for x in o.get("losses", []):
            got[(o.get("observer"), x.get("source"), x.get("method"))] = x
    for k, want in sorted(p.pairs.items()):
        x = got.get(k)
        if x is None:
            f.add(damage, out, f"(observer, source, method)={k} eps", "absent", want)
            continue
        for key, val in x.items():
            if not str(key).startswith("eps"):
                continue
            if val is None and (x.get("why") or x.get("reason")):
                continue
            ref = want if key == "eps" else None
            if ref is not None and below(val, ref):
                f.add(damage, out, f"(observer, source, method)={k} {key}", val, ref)
            elif ref is None and isinstance(val, float) and math.isnan(val):
                f.add(damage, out, f"(observer, source, method)={k} {key}", val, "a number")
    for path, val in _flat(rep).items():
        want = p.headlines.get(path)
        if want is not None and below(val, want):
            f.add(damage, out, path, val, want)
        elif want is None and (val is None or (isinstance(val, float) and math.isnan(val))):
            f.add(damage, out, path, val, "a number")
    for m, want in p.worst.items():
        eps = [x.get("eps") for (v, u, mm), x in got.items() if mm == m and v != u]
        top = max((e for e in eps if _num(e)), default=None)
        if below(top, want):
            f.add(damage, out, f"worst pair over entries ({m}) vs plan worst_pair.eps", top, want)


def check_coalitions(p: Plan, run: Path, nodes: list[int], damage: str, f: Findings) -> None:
    n = p.n
    v = nodes[0] if len(nodes) == 1 else 0
    coalitions = {tuple(sorted({v, (v + n // 2) % n})), ((v + 1) % n,)}
    for members in sorted(coalitions):
        floor_ = coalition_floor(p, members)
        if floor_ is None:
            return  # the family has no coalitions (central DP)
        out = f"coalition audit {list(members)}"
        try:
            rep = p.fam.coalition_audit(run, p.cfg, p.plan, list(members))
        except Exception as exc:
            f.append(f"[{damage}] {out}: raised {_exc(exc, run)}")
            continue
        got = {r.get("source"): r for r in rep.get("losses", [])}
        for u, want in sorted(floor_.items()):
            r = got.get(u)
            val = None if r is None else r.get("eps")
            if below(val, want):
                f.add(damage, out, f"source={u} eps", val, want)


def check_report(p: Plan, run: Path, damage: str, f: Findings) -> None:
    out = "report data (audit.json via report.load_audit)"
    try:
        a = report.load_audit(rundir.audit_path(run))
    except Exception as exc:
        f.append(f"[{damage}] {out}: raised {_exc(exc, run)}")
        return
    if below(a.ldp_eps, p.headlines.get("ldp.eps", -math.inf)):
        f.add(damage, out, "ldp_eps", a.ldp_eps, p.headlines["ldp.eps"])
    for m in audit.METHODS:
        have = {(v, u): e for v, u, _d, e in a.pairs.get(m, [])}
        mat = report._pairs_matrix(a, m)
        for (v, u, mm), want in sorted(p.pairs.items()):
            if mm != m:
                continue
            if below(have.get((v, u)), want):
                f.add(damage, out, f"pairs[{m}] (observer {v}, source {u})", have.get((v, u)), want)
            elif below(float(mat[v, u]), want):
                f.add(damage, out, f"heat-map matrix[{m}][{v}, {u}]", float(mat[v, u]), want)


CELL = re.compile(r'<rect class="cell"[^>]*data-v="(\d+)" data-u="(\d+)" data-eps="([^"]*)"')
WORST = re.compile(r"<dt>worst pairwise ε \((\w+)\)</dt><dd>([^<]*)</dd>")
CENTRAL = re.compile(r"every user loses ε = ([^ ]+) to anyone")
BELOW = re.compile(r"<strong>(\d+)</strong> below it")


def _shown(text: str) -> float | None:
    t = text.strip()
    if t == "∞":
        return math.inf
    try:
        return float(t)
    except ValueError:
        return None


def _slack(want: float, digits: int) -> float:
    """Half a unit of the last of ``digits`` significant digits of ``want``."""
    if not math.isfinite(want) or want == 0:
        return 0.0
    return 0.5 * 10 ** (math.floor(math.log10(abs(want))) - digits + 1)


def check_html(p: Plan, run: Path, damage: str, f: Findings) -> None:
    for m in audit.METHODS:
        out = f"report.html ({m})"
        try:
            (page,) = report.render_report(run, run / f"html-{m}", method=m, html="only")["files"]
            text = Path(page).read_text()
        except Exception as exc:
            f.append(f"[{damage}] {out}: render_report raised {_exc(exc, run)}")
            # The page's own numbers still count: build it from audit.json as the report would.
            doc = json.loads(rundir.audit_path(run).read_text())
            text = htmlreport.build_html(run, doc, method=m, notes=[])
        cells = {(int(v), int(u)): _shown(e) for v, u, e in CELL.findall(text)}
        central = audit.plan_report(p.cfg, source=None, method=m).get("central") is True
        if not central:
            for (v, u, mm), want in sorted(p.pairs.items()):
                if mm != m:
                    continue
                got = cells.get((v, u))
                if below(got, want, _slack(want, 6)):
                    f.add(
                        damage, out, f"heat-map cell (observer {v}, source {u}) data-eps", got, want
                    )
        else:
            mc = CENTRAL.search(text)
            got = _shown(mc.group(1)) if mc else None
            want = p.worst.get(m, -math.inf)
            if below(got, want, _slack(want, 4)):
                f.add(damage, out, "central-DP eps", got, want)
        mw = WORST.search(text)
        if m in p.worst and not central:
            got = _shown(mw.group(2)) if mw and mw.group(1) == m else None
            if below(got, p.worst[m], _slack(p.worst[m], 4)):
                f.add(damage, out, "headline 'worst pairwise ε'", got, p.worst[m])
        mb = BELOW.search(text)
        if mb and int(mb.group(1)) != 0:
            f.append(f"[{damage}] {out} 'plan against audit': {mb.group(1)} pair(s) below the plan")


def run_case(b: Base, label: str, change: dict, work: Path, f: Findings) -> bool:
    """Damage a copy of the run, check every output; whether the audit noticed."""
    run = work / "run"
    if run.exists():
        shutil.rmtree(run)
    shutil.copytree(b.run, run)
    for v, data in change.items():
        path = rundir.log_path(run, v)
        if data is None:
            path.unlink()
        else:
            path.write_bytes(data)
    try:
        rep = audit.audit_run(run)
    except Exception as exc:
        f.append(f"[{label}] audit_run raised {_exc(exc, run)}")
        return True
    check_audit(b.plan, rep, label, f)
    audit.save_audit(run, rep)
    check_report(b.plan, run, label, f)
    check_html(b.plan, run, label, f)
    check_coalitions(b.plan, run, sorted(change), label, f)
    return bool(rep.get("integrity"))


def sweep(name: str, kind: str, root: Path, work: Path, *, many: bool, seed: int) -> None:
    b = base_run(name, root)
    if not b.raw:  # central DP: no view log to damage; a damaged faults file instead
        cases = [("faults.json damaged", None)]
    else:
        cases = damages(b, kind, random.Random(f"{seed}-{name}-{kind}"), many)
    f = Findings()
    noticed = 0
    for label, change in cases:
        if change is None:
            run = work / "run"
            shutil.copytree(b.run, run)
            rundir.faults_path(run).write_text("{not json")
            rep = audit.audit_run(run)
            check_audit(b.plan, rep, label, f)
            audit.save_audit(run, rep)
            check_report(b.plan, run, label, f)
            check_html(b.plan, run, label, f)
            noticed += bool(rep["integrity"])
            continue
        noticed += run_case(b, label, change, work, f)
    # Not vacuous: the damage is there and the audit sees it.
    assert cases and noticed, f"{name}, damage '{kind}': no audit noticed any damage"
    assert not f, (
        f"{name}, damage '{kind}': {len(f)} figure(s) below the fault-free plan in "
        f"{len(cases)} damaged run(s):\n  "
        + "\n  ".join(f[:40])
        + (f"\n  ... and {len(f) - 40} more" if len(f) > 40 else "")
    )


#: The protocols with view logs (central DP runs in one process and writes none).
WITH_LOGS = [n for n in CONFIGS if n != "central-dp"]


#: The quick suite's damages: every kind but a truncation at every record boundary (13 s of the
#: quick suite over all the protocols), which the slow sweep below runs with every other kind.
QUICK_DAMAGES = tuple(d for d in DAMAGES if d != "truncate-boundary")


@pytest.mark.parametrize("kind", QUICK_DAMAGES)
@pytest.mark.parametrize("name", WITH_LOGS)
def test_no_figure_below_the_plan(name, kind, bases_root, tmp_path):
    sweep(name, kind, bases_root, tmp_path, many=False, seed=2024)


def test_central_dp_with_a_damaged_faults_file_is_not_below_the_plan(bases_root, tmp_path):
    """The trusted curator has no view log to damage: its run directory with a damaged
    faults file is the damaged case."""
    sweep("central-dp", "damaged faults file", bases_root, tmp_path, many=False, seed=2024)


@pytest.mark.slow
@pytest.mark.parametrize("kind", DAMAGES)
@pytest.mark.parametrize("name", WITH_LOGS)
def test_no_figure_below_the_plan_sweep(name, kind, bases_root, tmp_path):
    sweep(name, kind, bases_root, tmp_path, many=True, seed=7)


# ------------------------------------------------------------------ a real interrupted run

DECOR_SETS = ["graph.nodes=6", "protocol.rounds=1000", "network.deadline_s=20"]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "coordinator_free", *args],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT,
    )  # fmt: skip


def _last_step(path: Path) -> int:
    """The largest step among the whole records of a view log being written (-1: none yet)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return -1
    steps = [
        r["step"]
        for r in Log.parse(raw).records[1:]
        if isinstance(r, dict) and isinstance(r.get("step"), int)
    ]
    return max(steps, default=-1)


@pytest.mark.slow
def test_an_interrupted_decor_run_is_not_audited_below_the_plan(tmp_path):
    """`cfree run examples/decor-ring.toml` (6 nodes, 1000 rounds) interrupted by SIGINT once
    node 0's view log has passed round 100: the audit's SecLDP headline (and every pair) is at
    least the plan's, since the logs are unfinished."""
    import select

    out = tmp_path / "run"
    sets = [x for s in DECOR_SETS for x in ("--set", s)]
    cmd = [sys.executable, "-m", "coordinator_free", "run", str(EX / "decor-ring.toml")]
    proc = subprocess.Popen(
        [*cmd, *sets, "--out", str(out), "--no-audit"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, cwd=ROOT,
        preexec_fn=sigint_default,  # the test interrupts it
    )  # fmt: skip
    seen, at = "", -1
    try:
        deadline = time.monotonic() + 300
        log0 = out / "logs" / "node-0.vlog"
        while (at := _last_step(log0)) < 100:
            assert proc.poll() is None, f"cfree run ended before round 100: {seen[-2000:]}"
            assert time.monotonic() < deadline, f"no round 100 within 300 s: {seen[-2000:]}"
            # Wait for the launcher's progress output (or a quarter second), then look again.
            ready, _, _ = select.select([proc.stderr], [], [], 0.25)
            if ready:
                seen += os.read(proc.stderr.fileno(), 65536).decode(errors="replace")
        os.kill(proc.pid, signal.SIGINT)
        seen += proc.communicate(timeout=120)[1].decode(errors="replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 130, seen[-2000:]

    plan_cli = _cli("plan", str(EX / "decor-ring.toml"), *sets, "--json")
    assert plan_cli.returncode == 0, plan_cli.stderr
    planned = json.loads(plan_cli.stdout)["secldp"]
    audit_cli = _cli("audit", str(out), "--json")
    assert audit_cli.returncode == 0, audit_cli.stderr
    audited = json.loads(audit_cli.stdout)
    f = Findings()
    damage = f"SIGINT after round {at} of 1000"
    for m, block in sorted(planned.items()):
        if not isinstance(block, dict):
            continue
        for key, want in sorted(block.items()):
            if key.startswith("eps") and _num(want):
                got = (audited.get("secldp") or {}).get(m, {}).get(key)
                if below(got, want):
                    f.add(damage, "cfree audit --json", f"secldp.{m}.{key}", got, want)
    check_audit(
        plan_of(config.load(rundir.config_path(out))), audited, damage, f, "cfree audit --json"
    )
    assert audited["integrity"], "the audit of an interrupted run has no integrity finding"
    assert not f, f"decor, {damage}: {len(f)} figure(s) below the plan:\n  " + "\n  ".join(f[:40])
