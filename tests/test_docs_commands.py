"""Every `cfree` command in README.md and docs/*.md runs, so the docs cannot drift from the tool.

tests/doccmds.py extracts the commands (and the shell lines of the blocks that are scripts).
The quick suite parses every command with cfree's own argument parser and runs the ones whose
documented output is an error, checking the message. The slow suite runs every file's commands
for real, in order, in a scratch directory holding `examples/`: each must end with the status
the docs state (0 unless they say `# exit N` or show an error) and never with a traceback.

What the docs leave to the reader is supplied here, and listed below so it stays small:
`runs/<run-dir>` is the newest run directory the commands made so far; a hosts file is built
from real `cfree keypair` lines; `lan/run`, which the LAN guide fills by copying logs from
three machines, is a run of the same config on this one; `/tmp/` paths live in the scratch
directory. A command that takes long gets a smaller size (OVERRIDES). Commands that create
network namespaces need root and `ip`; without them they are skipped, saying so (in CI, with
CI=true, the test fails instead).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ci import IN_CI
from doccmds import REPO, DocCommand, all_commands, commands_of

from coordinator_free.cli import build_parser

COMMANDS = all_commands()

# Commands that would take minutes, made smaller: doc path and command text -> the text run.
OVERRIDES = {
    # n = 2048: about 30 s alone; the same command at n = 256 exercises the same code paths.
    ("README.md", "cfree plan --set graph.kind=hypercube --set graph.dim=11"): (
        "cfree plan --set graph.kind=hypercube --set graph.dim=8"
    ),
    # `cfree stack` names the image by the ID it resolves with docker; the suite has no image.
    **{
        (doc, "cfree stack examples/muffliato-ring.toml --dir stack/ring"): (
            "cfree stack examples/muffliato-ring.toml --dir stack/ring --image sha256:" + "0" * 64
        )
        for doc in ("README.md", "docs/deploy.md")
    },
    ("docs/deploy.md", "cfree stack examples/muffliato-ring.toml --dir stack/mn --groups 3"): (
        "cfree stack examples/muffliato-ring.toml --dir stack/mn --groups 3 --image sha256:"
        + "0" * 64
    ),
}
# STEPS in docs/results.md stands for each row's number of steps.
PLACEHOLDERS = {"docs/results.md": {"protocol.steps=STEPS": "protocol.steps=10"}}


def _keypair_hosts(count: int, address: str) -> str:
    """Shell lines writing hosts.txt from `count` real `cfree keypair` public lines."""
    lines = ["rm -f hosts.txt"]
    for i in range(count):
        addr = address.format(i=i)
        lines.append(f"cfree keypair --out keys/host-{i}/ --address {addr} >> hosts.txt")
    return "\n".join(lines)


# Shell run before a command: what the docs have the reader do by hand or on other machines.
PREPARE = {
    # README: the keys come from `cfree keypair` on each of the 8 hosts of the default ring.
    ("README.md", "cfree roster --hosts hosts.txt --out lan/"): _keypair_hosts(
        8, "192.0.2.{i}:7000"
    ),
    # docs/deploy.md: alpha, beta, gamma of the walk-through, keys from `cfree keypair`.
    (
        "docs/deploy.md",
        "cfree roster --hosts hosts.txt --set graph.nodes=3 --set run.name=lan-demo "
        "--set network.connect_timeout_s=120 --cfree-cmd /opt/cfree/venv/bin/cfree --out lan/",
    ): (_keypair_hosts(3, "192.168.1.1{i}:7000")),  # fmt: skip
    # docs/deploy.md: collect.sh would fetch lan/run from the three hosts; a run of the same
    # config on this machine stands in for it.
    ("docs/deploy.md", "cfree audit lan/run"): "cfree run lan/config.toml --out lan/run --quiet",
}


def _text_to_run(cmd: DocCommand) -> str:
    text = OVERRIDES.get((cmd.doc, cmd.text), cmd.text)
    for old, new in PLACEHOLDERS.get(cmd.doc, {}).items():
        text = text.replace(old, new)
    return text


def test_the_docs_hold_commands_and_every_override_names_one():
    docs = {c.doc for c in COMMANDS}
    for name in ("README.md", "docs/config.md", "docs/deploy.md", "docs/faults.md", "docs/lab.md"):
        assert name in docs, f"no cfree command found in {name}"
    assert len(COMMANDS) >= 60, len(COMMANDS)
    known = {(c.doc, c.text) for c in COMMANDS}
    for key in (*OVERRIDES, *PREPARE):
        assert key in known, f"{key[0]} no longer has the command {key[1]!r}"
    for doc, subs in PLACEHOLDERS.items():
        assert any(old in c.text for c in COMMANDS if c.doc == doc for old in subs), doc


def test_the_extractor_reads_prompts_continuations_comments_and_expected_errors(tmp_path):
    md = tmp_path / "x.md"
    md.write_text(
        "text `cfree run` in prose is not a command\n"
        "```sh\n"
        "cfree run --set a=1 \\\n"
        "    --set b=2   # a comment with 'quotes\n"
        "docker-compose up\n"
        "cfree audit r --strict   # exit 1: damaged\n"
        "```\n"
        "```\n"
        "$ cfree plan --set graph.x=1\n"
        "cfree plan: error: unknown key graph.x\n"
        "```\n"
        "```\n"
        "rm -f a\n"
        "cfree lab up --nodes 2\n"
        "cfree lab up: error: already exists\n"
        "```\n"
    )
    import doccmds

    old = doccmds.REPO
    doccmds.REPO = tmp_path
    try:
        found = commands_of(md)
    finally:
        doccmds.REPO = old
    got = [(c.line, c.text, c.is_cfree, c.expect_exit, c.expect_stderr) for c in found]
    assert got == [
        (3, "cfree run --set a=1 --set b=2", True, 0, []),
        (6, "cfree audit r --strict", True, 1, []),
        (9, "cfree plan --set graph.x=1", True, None, ["cfree plan: error: unknown key graph.x"]),
        (13, "rm -f a", False, 0, []),
        (14, "cfree lab up --nodes 2", True, None, ["cfree lab up: error: already exists"]),
    ]


@pytest.mark.parametrize(
    "cmd", [c for c in COMMANDS if c.is_cfree], ids=lambda c: f"{c.where} {c.text[:60]}"
)
def test_every_documented_command_parses(cmd):
    text = _text_to_run(cmd).replace("runs/<run-dir>", "runs/x")
    cmd = DocCommand(cmd.doc, cmd.line, text, cmd.block)
    try:
        build_parser().parse_args(cmd.argv)
    except SystemExit as exc:
        pytest.fail(f"{cmd.where}: `{cmd.text}` does not parse (exit {exc.code})")


def _cfree_bin(tmp: Path) -> Path:
    """A directory whose `cfree` runs this interpreter's coordinator_free (for the commands
    and for the peers that generated scripts start)."""
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    exe = bindir / "cfree"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m coordinator_free "$@"\n')
    exe.chmod(0o755)
    return bindir


def _scratch(tmp: Path) -> tuple[Path, dict]:
    work = tmp / "work"
    work.mkdir()
    (work / "examples").symlink_to(REPO / "examples")
    (work / "tmp").mkdir()
    env = dict(os.environ)
    env["PATH"] = f"{_cfree_bin(tmp)}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("COLUMNS", None)
    return work, env


def _newest_run(work: Path) -> str:
    runs = [p.parent for p in (work / "runs").glob("*/config.toml")]
    if not runs:
        raise AssertionError("runs/<run-dir>: no command made a run directory before this one")
    newest = max(runs, key=lambda p: p.stat().st_mtime)
    return newest.relative_to(work).as_posix()


def _shell(text: str, work: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", text],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _check(cmd: DocCommand, text: str, proc: subprocess.CompletedProcess) -> str | None:
    """What is wrong with how the command ended, or None."""
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
    if "Traceback (most recent call last)" in proc.stderr:
        return f"{cmd.where}: `{text}` printed a traceback:\n{tail}"
    if cmd.expect_exit is None:
        if proc.returncode == 0:
            return f"{cmd.where}: `{text}` succeeded; the docs show it failing"
    elif proc.returncode != cmd.expect_exit:
        return (
            f"{cmd.where}: `{text}` exited {proc.returncode}, the docs expect "
            f"{cmd.expect_exit}:\n{tail}"
        )
    said = " ".join(proc.stderr.split())
    for line in cmd.expect_stderr:
        if " ".join(line.split()) not in said:
            return f"{cmd.where}: `{text}` did not print the documented\n  {line}\nbut:\n{tail}"
    return None


def _substitute(cmd: DocCommand, work: Path) -> str:
    text = _text_to_run(cmd)
    if "runs/<run-dir>" in text:
        text = text.replace("runs/<run-dir>", _newest_run(work))
    return re.sub(r"(?<![\w/.])/tmp/", f"{work}/tmp/", text)


@pytest.mark.parametrize(
    "cmd", [c for c in COMMANDS if c.expect_stderr], ids=lambda c: f"{c.where} {c.text[:60]}"
)
def test_documented_errors_are_the_errors_printed(cmd, tmp_path):
    work, env = _scratch(tmp_path)
    text = _substitute(cmd, work)
    problem = _check(cmd, text, _shell(text, work, env, timeout=120))
    assert problem is None, problem


def _why_no_lab() -> str | None:
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` command to create network namespaces"
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    return None


LAB_NAMES = ("cfree", "small")  # the lab names the docs use


def _lab_record(name: str) -> Path:
    return Path("/run/cfree-lab") / f"{name}.json"


@pytest.mark.slow
@pytest.mark.parametrize(
    "doc",
    sorted({c.doc for c in COMMANDS}, key=lambda d: (d != "README.md", d)),
)
def test_every_documented_command_runs(doc, tmp_path):
    cmds = [c for c in COMMANDS if c.doc == doc]
    uses_lab = [c for c in cmds if c.is_cfree and c.argv[:1] == ["lab"]]
    no_lab = _why_no_lab() if uses_lab else None
    if no_lab and IN_CI:
        pytest.fail(f"{doc}: the lab commands {no_lab} (CI=true: failing instead of skipping)")
    if uses_lab and not no_lab:
        taken = [n for n in LAB_NAMES if _lab_record(n).exists()]
        assert not taken, f"labs {taken} are up; the docs' commands create labs of these names"
    work, env = _scratch(tmp_path)
    failures, skipped, ran = [], [], []
    try:
        for cmd in cmds:
            if no_lab and cmd in uses_lab:
                skipped.append(cmd.where)
                continue
            prepare = PREPARE.get((cmd.doc, cmd.text))
            if prepare:
                proc = _shell(prepare, work, env, timeout=600)
                if proc.returncode != 0:
                    failures.append(f"{cmd.where}: preparing failed:\n{proc.stderr[-2000:]}")
                    continue
            try:
                text = _substitute(cmd, work)
            except AssertionError as exc:
                failures.append(f"{cmd.where}: {exc}")
                continue
            began = time.monotonic()
            proc = _shell(text, work, env, timeout=900)
            ran.append(f"{time.monotonic() - began:6.1f} s  {cmd.where}  {text}")
            problem = _check(cmd, text, proc)
            if problem:
                failures.append(problem)
    finally:
        if uses_lab and not no_lab:
            for name in LAB_NAMES:
                if _lab_record(name).exists():
                    _shell(f"cfree lab down --name {name}", work, env, timeout=120)
    print(f"{doc}: ran {len(ran)} commands")
    print("\n".join(ran))
    if skipped:
        print(f"{doc}: skipped (lab: {no_lab}): {', '.join(skipped)}")
    assert not failures, "\n\n".join(failures)


# ------------------------------------------------------------------ the examples of every --help


def _example_lines(epilog: str | None) -> list[str]:
    """The command lines an epilog lists under its ``examples`` heading (continuations
    joined)."""
    if not epilog or not epilog.lstrip().startswith("example"):
        return []
    out: list[str] = []
    for raw in epilog.splitlines()[1:]:
        if not raw.startswith("  "):
            continue
        line = raw.strip()
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + line
        else:
            out.append(line)
    return out


def help_examples() -> dict[str, list[str]]:
    """Every subcommand -> the examples its --help ends with; a subcommand grouping actions
    (``log``, ``lab``) is represented by its own examples and its actions'."""
    parser = build_parser()
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: dict[str, list[str]] = {}
    for name, sub in top.choices.items():
        lines = _example_lines(sub.epilog)
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    lines += [x for x in _example_lines(child.epilog) if x not in lines]
        found[name] = lines
    return found


HELP_EXAMPLES = help_examples()
#: Tools an example may use that this machine may lack (a cluster's clients, root's ip).
OPTIONAL_TOOLS = ("kubectl", "kubernetes-validate", "docker", "ip")


def _cfree_argvs(line: str) -> list[list[str]]:
    """The cfree commands of a shell line (split at ; & && | and redirections), each as
    argv without `cfree`; those using a shell variable are left out (bash expands them)."""
    import shlex

    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    segments, cur = [], []
    skip_next = False
    for tok in lex:
        if skip_next:
            skip_next = False
            continue
        if tok in (">", ">>", "<", "2>"):
            skip_next = True
            continue
        if set(tok) <= set(";&|"):
            segments.append(cur)
            cur = []
            continue
        cur.append(tok)
    segments.append(cur)
    return [s[1:] for s in segments if s[:1] == ["cfree"] and not any("$" in t for t in s)]


def test_every_subcommand_help_ends_with_examples_that_parse():
    assert {"run", "plan", "audit", "report", "simulate", "ls", "peer"} <= set(HELP_EXAMPLES)
    for name, lines in HELP_EXAMPLES.items():
        assert 2 <= len(lines) <= 8, f"cfree {name} --help: {len(lines)} example(s)"
        argvs = [a for line in lines for a in _cfree_argvs(line)]
        assert any(a[:1] == [name] for a in argvs) or name == "peer", (name, lines)
        for argv in argvs:
            try:
                build_parser().parse_args(argv)
            except SystemExit as exc:
                pytest.fail(f"cfree {name} --help: `cfree {' '.join(argv)}` does not parse ({exc})")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HELP_EXAMPLES))
def test_every_help_example_runs(name, tmp_path):
    """A subcommand's examples, in order, as one script in a scratch directory holding
    `examples/` (as the docs' commands run): every line must succeed. Lines needing a tool
    this machine lacks (a cluster's client, root for the lab) are left out, saying so."""
    if name == "lab" and _why_no_lab():
        if IN_CI:
            pytest.fail(f"cfree lab --help examples: {_why_no_lab()}")
        pytest.skip(f"cfree lab --help examples: {_why_no_lab()}")
    work, env = _scratch(tmp_path)
    lines, left_out = [], []
    for line in HELP_EXAMPLES[name]:
        first = line.split()[0]
        if first in OPTIONAL_TOOLS and shutil.which(first) is None:
            left_out.append(line)
            continue
        if first in ("kubectl", "docker"):  # a client without its cluster: nothing to run on
            left_out.append(line)
            continue
        if first == "cfree" and line.split()[1:2] == ["stack"] and "--image" not in line:
            # as OVERRIDES does for the docs: the suite has no image to resolve by name
            code, sep, comment = line.partition("#")
            line = f"{code.rstrip()} --image sha256:{'0' * 64}" + (f"   #{comment}" if sep else "")
        lines.append(re.sub(r"(?<![\w/.])/tmp/", f"{work}/tmp/", line))
    if not lines:
        pytest.skip(f"cfree {name}: every example needs what this machine lacks: {left_out}")
    # Each line must end with the status it states (`# exit N`, as in the docs), else 0.
    script = ""
    for k, line in enumerate(lines):
        want = re.search(r"#\s*exit (\d+)", line)
        script += (
            f"{line}\nrc=$?; [ $rc -eq {want.group(1) if want else 0} ] || "
            f"{{ echo 'example {k + 1} exited '$rc >&2; exit 1; }}\n"
        )
    try:
        proc = _shell(script, work, env, timeout=900)
    finally:
        if name == "lab":
            for lab in LAB_NAMES:
                if _lab_record(lab).exists():
                    _shell(f"cfree lab down --name {lab}", work, env, timeout=120)
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
    assert "Traceback (most recent call last)" not in proc.stderr, tail
    assert proc.returncode == 0, f"cfree {name} --help examples failed:\n{script}\n{tail}"
    if left_out:
        print(f"cfree {name}: left out (tool missing here): {left_out}")


# ------------------------------------------------------------------ README's compose section


def readme_compose_lines() -> list[str]:
    """The shell lines of README's compose item (tour item 9), as written, up to the Swarm
    stack (continuations joined; comments left out)."""
    text = (REPO / "README.md").read_text()
    start = text.index("# 9. A docker-compose cluster")
    end = text.index("#    A Docker Swarm stack", start)
    out: list[str] = []
    for raw in text[start:end].splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + line
        else:
            out.append(line)
    return out


def test_readme_compose_section_builds_offline_as_deploy_md_says():
    lines = readme_compose_lines()
    ups = [x for x in lines if " up --build" in x]
    assert ups and all(
        "CFREE_BASE_IMAGE=cfree-base:bookworm CFREE_PIP_OPTIONS=--no-index" in x for x in ups
    ), lines
    assert lines[0] == "bash deploy/build-base-image.sh && bash deploy/fetch-wheels.sh"
    deploy = (REPO / "docs" / "deploy.md").read_text()
    assert "CFREE_BASE_IMAGE=cfree-base:bookworm CFREE_PIP_OPTIONS=--no-index" in deploy


@pytest.mark.docker
def test_readme_compose_section_runs_as_written(tmp_path):
    """README's compose lines, in order, in a copy of the repository (the clusters write their
    run directories there): the base image, the wheels, the top-level cluster and one
    `cfree compose` made; each cluster ends with its audit."""
    from dockerimg import need_docker

    need_docker()
    need_compose = shutil.which("docker-compose")
    if need_compose is None:
        pytest.skip("docker-compose (v1), which README's lines use, is not installed")
    copy = tmp_path / "repo"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
        text=True, check=True,
    ).stdout.split()  # fmt: skip
    for name in files:
        src = REPO / name
        if src.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, copy / name)
    _, env = _scratch(tmp_path)
    failures = []
    for line in readme_compose_lines():
        proc = subprocess.run(["bash", "-c", line], cwd=copy, env=env, capture_output=True,
                              text=True, timeout=3600, stdin=subprocess.DEVNULL)  # fmt: skip
        if proc.returncode != 0:
            failures.append(f"`{line}` exited {proc.returncode}:\n{proc.stderr[-3000:]}")
            break
    for project in (copy, copy / "cluster"):
        subprocess.run(["docker-compose", "down", "-v"], cwd=project, env=env,
                       capture_output=True, timeout=600)  # fmt: skip
    assert not failures, "\n".join(failures)
    assert (copy / "runs" / "compose" / "audit.json").is_file()
    assert (copy / "cluster" / "run" / "audit.json").is_file()
