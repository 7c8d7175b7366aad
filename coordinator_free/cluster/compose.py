"""docker-compose clusters: the compose file for any config, and the roles of the peer image.

``cfree compose CONFIG`` writes a directory holding ``docker-compose.yml`` and the config the
containers read. The compose file has three kinds of services, all from one image
(``peer/Dockerfile``):

- ``keygen`` (one-shot): makes one X25519 key per node, each into its own named volume
  ``key-<i>``, and writes the public roster (addresses ``peer-<i>:PORT``) and the config into the
  run directory, a bind mount on the host;
- ``peer-<i>``: one node on the user-defined bridge network ``cfree``; it mounts the run
  directory and only its own key volume;
- ``auditor``: starts once every peer has finished, replays the view logs and writes
  ``audit.json`` next to them.

When keygen refuses (an earlier run in the run directory, a config of another size), it
writes the reason into every key volume as ``REFUSED`` and ends with status 0; each peer's
entrypoint then prints that reason and ends with status 0 without starting, and the auditor
finds the run directory's audit current and leaves it alone. Compose v1 shows none of a
project's output as soon as one ``depends_on`` condition fails (only "Container ... exited
with code N"), so a refusal that failed would be silent there; this way the reason shows under
v1 and v2 alike, no peer ever starts with an earlier run's key, and nothing in the earlier run
directory is written.

The roles run as ``python -m coordinator_free.cluster.compose keygen|audit`` (and ``cfree
peer`` for a node), called by the image's entrypoint. The file uses only what ``docker compose``
(v2) and ``docker-compose`` (v1, 1.29) both read: no ``version`` key, ``depends_on`` conditions,
``${VAR:-default}`` substitution.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from coordinator_free import config as config_mod
from coordinator_free import roster as roster_mod
from coordinator_free import rundir
from coordinator_free.errors import CfreeError

IMAGE = "coordinator-free-peer:latest"
PORT = 7000
#: Mount points inside the containers.
CONFIG_MOUNT = "/cfree/config.toml"
FILES_MOUNT = "/cfree/files"
RUN_MOUNT = "/cfree/run"
KEYS_ROOT = "/cfree/keys"
KEY_MOUNT = "/cfree/key"
#: The project root when running from a checkout (holds peer/Dockerfile).
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class ComposeError(CfreeError, ValueError):
    """A compose file cannot be written, or a role cannot run; the message says why."""


def service(i: int) -> str:
    return f"peer-{i}"


def key_volume(i: int) -> str:
    return f"key-{i}"


def node_count(cfg: config_mod.Config) -> int:
    """The number of peers the config runs; a trusted-curator config has none to place."""
    from coordinator_free.families import family_of

    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    if not fam.has_peers(cfg):
        raise ComposeError(
            f"protocol {cfg.protocol.name} is the trusted-curator baseline: one process, no "
            "peers to run as containers (use cfree run)"
        )
    return plan.n


def _q(s: str) -> str:
    """A YAML scalar: JSON strings are valid YAML, and quoting keeps ``${...}`` and ``:`` literal."""
    return json.dumps(s)


def _list(items: list[str], indent: int) -> list[str]:
    pad = " " * indent
    return [f"{pad}- {_q(x)}" for x in items]


def render(
    n: int,
    *,
    describe: str,
    config_file: str = rundir.CONFIG,
    files_dir: str | None = None,
    run_dir: str = "./run",
    build_context: str | None = ".",
    port: int = PORT,
) -> str:
    """The text of a compose file for ``n`` peers (deterministic: same inputs, same bytes).

    Paths are relative to the compose file's directory. ``build_context=None`` leaves out the
    build sections (the image must then exist or be pullable as ``$CFREE_IMAGE``).
    """
    if n < 2:
        raise ComposeError(f"a cluster needs at least 2 nodes, the config has {n}")
    if not run_dir.startswith(("/", "./", "../", "~")):
        # Compose reads a bare name as a named volume, not a host directory.
        run_dir = "./" + run_dir
    run_mount = f"${{CFREE_RUN_DIR:-{run_dir}}}:{RUN_MOUNT}"
    files = [f"./{files_dir}:{FILES_MOUNT}:ro"] if files_dir else []
    lines = [
        f"# coordinator-free cluster: {describe}.",
        "# Written by `cfree compose`; regenerate it from the config rather than editing it.",
        "#",
        "#   docker compose up --build          (or: docker-compose up --build)",
        "#",
        "# keygen writes one private key per node, each into its own volume (a peer mounts only",
        "# its own), and the public roster into the run directory; the peers talk over the bridge",
        "# network `cfree` on port " + str(port) + "; the auditor runs once every peer has",
        f"# finished and writes audit.json next to the logs in ${{CFREE_RUN_DIR:-{run_dir}}}.",
        "# If a peer fails, the auditor does not start by itself; audit what the others logged",
        "# with `docker compose run --rm --no-deps auditor`. No registry? See docs/deploy.md:",
        "# CFREE_BASE_IMAGE=cfree-base:bookworm CFREE_PIP_OPTIONS=--no-index.",
        "",
        "services:",
    ]

    def common(role_cmd: list[str], build: bool = False) -> list[str]:
        # One service builds the image, the others use it by name: both compose versions then
        # build it once (keygen runs first) and never try to pull it.
        out = [f"    image: {_q('${CFREE_IMAGE:-' + IMAGE + '}')}"]
        if build and build_context is not None:
            out += [
                "    build:",
                f"      context: {_q(build_context)}",
                f"      dockerfile: {_q('peer/Dockerfile')}",
                "      args:",
                f"        BASE_IMAGE: {_q('${CFREE_BASE_IMAGE:-python:3.11-slim}')}",
                f"        PIP_OPTIONS: {_q('${CFREE_PIP_OPTIONS:-}')}",
            ]
        out.append("    command: [" + ", ".join(_q(c) for c in role_cmd) + "]")
        out.append("    init: true")  # a real PID 1: signals reach the peer, zombies are reaped
        return out

    lines += ["  keygen:", *common(["keygen", "--nodes", str(n), "--port", str(port)], True)]
    lines += ["    network_mode: none", "    volumes:"]
    lines += _list([f"./{config_file}:{CONFIG_MOUNT}:ro", *files, run_mount], 6)
    lines += _list([f"{key_volume(i)}:{KEYS_ROOT}/{i}" for i in range(n)], 6)
    for i in range(n):
        lines += [f"  {service(i)}:", *common(["peer"])]
        lines += [
            f"    hostname: {_q(service(i))}",
            "    environment:",
            f"      CFREE_NODE_ID: {_q(str(i))}",
            f"      CFREE_PORT: {_q(str(port))}",
            "    depends_on:",
            "      keygen:",
            "        condition: service_completed_successfully",
            "    networks:",
            "      - cfree",
            "    volumes:",
        ]
        lines += _list([*files, run_mount, f"{key_volume(i)}:{KEY_MOUNT}:ro"], 6)
    lines += ["  auditor:", *common(["audit"]), "    network_mode: none", "    depends_on:"]
    for i in range(n):
        lines += [f"      {service(i)}:", "        condition: service_completed_successfully"]
    lines += ["    volumes:", *_list([*files, run_mount], 6)]
    lines += ["", "networks:", "  cfree:", "    driver: bridge", "", "volumes:"]
    lines += [f"  {key_volume(i)}: {{}}" for i in range(n)]
    return "\n".join(lines) + "\n"


def describe(cfg: config_mod.Config, n: int) -> str:
    g = cfg.graph
    return f"{n} peers, graph {g.kind}, protocol {cfg.protocol.name}, run {cfg.run.name!r}"


def write_compose(
    cfg: config_mod.Config,
    out_dir: Path,
    *,
    file_name: str = "docker-compose.yml",
    config_file: str = rundir.CONFIG,
    run_dir: str = "./run",
    port: int = PORT,
    force: bool = False,
) -> dict:
    """Write ``out_dir/file_name`` and the container's config (plus any graph or data file the
    config names, copied under ``files/``); return what was written."""
    n = node_count(cfg)
    out_dir = Path(out_dir)
    compose_path = out_dir / file_name
    cfg_path = out_dir / config_file
    for p in (compose_path, cfg_path):
        if p.exists() and not force:
            raise ComposeError(f"{p} already exists (--force overwrites it)")
    # Files the config uses live on this machine; the containers see copies under files/.
    container_cfg, copies = config_mod.portable_config(cfg, "files")
    files_dir = "files" if copies else None
    if copies and Path(config_file).parent != Path("."):
        raise ComposeError(
            "a config that names a graph or data file must sit next to the compose file "
            "(--config-file without a directory): its paths are resolved against /cfree"
        )
    build_context = None
    if (PROJECT_ROOT / "peer" / "Dockerfile").is_file():
        # Relative inside the checkout (the tree can move), absolute from anywhere else.
        where = out_dir.resolve()
        inside = where == PROJECT_ROOT or PROJECT_ROOT in where.parents
        build_context = os.path.relpath(PROJECT_ROOT, where) if inside else str(PROJECT_ROOT)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    for name, src in copies.items():
        (out_dir / name).parent.mkdir(exist_ok=True)
        shutil.copyfile(src, out_dir / name)
    cfg_path.write_text(container_cfg.to_toml())
    text = render(
        n,
        describe=describe(cfg, n),
        config_file=config_file,
        files_dir=files_dir,
        run_dir=run_dir,
        build_context=build_context,
        port=port,
    )
    compose_path.write_text(text)
    return {
        "compose_file": str(compose_path),
        "config": str(cfg_path),
        "nodes": n,
        "build_context": build_context,
        "files": sorted(str(out_dir / name) for name in copies),
    }


# ----------------------------------------------------------------------------------- roles


#: The file in a key volume that says why keygen refused (read by the peer's entrypoint).
REFUSED = "REFUSED"


def refuse_peers(n: int, reason: str, keys_root: Path = Path(KEYS_ROOT)) -> None:
    """Tell each of the ``n`` peers, through its key volume, why keygen made no keys."""
    for i in range(n):
        dest_dir = keys_root / str(i)
        dest_dir.mkdir(parents=True, exist_ok=True)
        tmp = dest_dir / f".{REFUSED}.tmp"
        tmp.write_text(reason.rstrip("\n") + "\n")
        os.replace(tmp, dest_dir / REFUSED)


def keygen_role(
    n: int,
    port: int,
    *,
    config_path: Path = Path(CONFIG_MOUNT),
    run_dir: Path = Path(RUN_MOUNT),
    keys_root: Path = Path(KEYS_ROOT),
) -> roster_mod.Roster:
    """The one-shot keygen service: roster + config into the run directory, key i into
    ``keys_root/i`` (a volume only peer i mounts). Refuses to touch an earlier run's files."""
    cfg = config_mod.load(config_path)
    have = node_count(cfg)
    if have != n:
        raise ComposeError(
            f"{config_path} describes {have} nodes but this compose file was written for {n}: "
            "regenerate it with `cfree compose`"
        )
    roster_path = rundir.roster_path(run_dir)
    if roster_path.exists():
        raise ComposeError(
            f"the run directory already holds a run ({roster_path} exists): move it away, or "
            "point CFREE_RUN_DIR at a new directory, then `docker compose up` again"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    leftovers = [p for p in (rundir.LOGS, rundir.RESULTS, rundir.AUDIT) if (run_dir / p).exists()]
    if leftovers:
        raise ComposeError(
            f"the run directory {run_dir} holds {', '.join(leftovers)} of an earlier run but no "
            "roster: move them away first"
        )
    hosts = [(service(i), port) for i in range(n)]
    # Keys are made in the container's own file system, never in the run directory (a bind
    # mount every peer and the host see), then each goes to the volume of its node only.
    keys_root.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".keygen-", dir=keys_root))
    ros = roster_mod.generate_keys(n, rundir.keys_dir(staged), hosts=hosts, name=cfg.run.name)
    try:
        for i in range(n):
            dest_dir = keys_root / str(i)
            dest_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(dest_dir, 0o700)
            (dest_dir / REFUSED).unlink(missing_ok=True)  # an earlier refusal no longer holds
            # A volume kept from an earlier run holds that run's key: it belongs to a roster
            # that no longer exists, and this node's new key replaces it.
            for old in dest_dir.glob("node-*.key"):
                old.unlink()
            shutil.move(
                str(rundir.key_path(rundir.keys_dir(staged), i)), roster_mod.key_path(dest_dir, i)
            )
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    # The run directory is self-contained: the files the config uses go in with it, so the
    # host (or anyone the directory is handed to) can audit it with `cfree audit`.
    portable, files = config_mod.portable_config(cfg, "files")
    for name, src in files.items():
        (run_dir / name).parent.mkdir(exist_ok=True)
        shutil.copyfile(src, run_dir / name)
    (rundir.config_path(run_dir)).write_text(portable.to_toml())
    rundir.logs_dir(run_dir).mkdir(exist_ok=True)
    rundir.results_dir(run_dir).mkdir(exist_ok=True)
    roster_mod.save_roster(roster_path, ros)
    return ros


def run_deadline_s(cfg: config_mod.Config) -> int:
    """How long a peer may take at most: connecting, every step at twice its deadline, and a
    margin (the orchestrators' limit on a peer, and how long an auditor waits for results)."""
    from coordinator_free.families import make_plan

    steps = make_plan(cfg).steps
    return int(cfg.network.connect_timeout_s + (steps + 2) * 2 * cfg.network.deadline_s + 300)


def idle_after(cfg: config_mod.Config) -> float:
    """How long a run directory stays untouched, once a peer has finished, before the peers
    still without a result are taken for gone: a live peer writes to its view log at least once
    per step deadline (a value, or a miss when the deadline passes)."""
    return 3 * cfg.network.deadline_s + 10


def wait_for_peers(
    run_dir: Path,
    n: int,
    *,
    timeout_s: float,
    idle_s: float,
    poll_s: float = 1.0,
    finished=None,
) -> str:
    """Wait until the run directory holds a result from each of the ``n`` peers (``"all"``),
    or a peer has finished and nothing in the directory changed for ``idle_s`` (``"idle"``: the
    others are gone, e.g. killed), or ``timeout_s`` passed (``"timeout"``). Says what it waits
    for, at most every 30 s. For orchestrators with no "after these have ended" (Swarm,
    Kubernetes): the audit of what is there then names every peer without a result.
    ``finished()``, if given, counts the finished peers instead of their results (a log
    collector: the peers that shipped their files)."""
    import time

    t0 = time.monotonic()
    last_said = float("-inf")
    while True:
        results = list(rundir.results_dir(run_dir).glob("node-*.json"))
        done = finished() if finished is not None else len(results)
        now = time.monotonic()
        if done >= n:
            return "all"
        if now - t0 >= timeout_s:
            print(
                f"auditor: {len(results)} of {n} peers finished after {timeout_s:.0f} s; auditing"
            )
            return "timeout"
        if results or done:
            touched = [*results, *rundir.logs_dir(run_dir).glob("*")]
            newest = max((p.stat().st_mtime for p in touched if p.exists()), default=0.0)
            if time.time() - newest >= idle_s:
                print(
                    f"auditor: {len(results)} of {n} peers finished and nothing moved for "
                    f"{idle_s:.0f} s: the others are gone; auditing"
                )
                return "idle"
        if now - last_said >= 30:
            print(f"auditor: waiting: {len(results)} of {n} peers finished", flush=True)
            last_said = now
        time.sleep(poll_s)


def audit_role(
    run_dir: Path = Path(RUN_MOUNT),
    *,
    wait_for: int | None = None,
    timeout_s: float = 3600.0,
    idle_s: float | None = None,
    collect_key: Path | None = None,
    collect_port: int = 7001,
) -> dict:
    """The auditor service: replay the logs, write ``audit.json`` beside them, print the report.
    With ``wait_for`` (the number of peers), first :func:`wait_for_peers`. With
    ``collect_key`` (the collector's private key), meanwhile receive the peers' shipped logs
    and results on ``collect_port`` (:mod:`~coordinator_free.cluster.shiplogs`)."""
    from coordinator_free.accounting.audit import audit_run, audit_state, save_audit
    from coordinator_free.accounting.render import print_audit as _print_audit

    if audit_state(run_dir) == "current":
        # The peers did not run (keygen refused) or the run was audited already: the audit
        # there is that of these very logs, so recomputing it could only rewrite the file.
        print(f"auditor: {rundir.audit_path(run_dir)} is the audit of the logs there; not redone")
        return json.loads(rundir.audit_path(run_dir).read_bytes())
    collector, shipped = None, None
    if collect_key:
        collector, shipped = _start_collector(run_dir, collect_key, collect_port)
    try:
        if wait_for is not None:
            if idle_s is None:
                idle_s = idle_after(config_mod.load(rundir.config_path(run_dir)))
            wait_for_peers(run_dir, wait_for, timeout_s=timeout_s, idle_s=idle_s, finished=shipped)
    finally:
        if collector is not None:
            collector()
    rep = audit_run(run_dir)
    save_audit(run_dir, rep, role="auditor job", say=print)
    _print_audit(rep)
    print(f"wrote {run_dir / 'audit.json'}")
    return rep


def _start_collector(run_dir: Path, key_path: Path, port: int):
    """Run a log collector on ``port`` in a thread of its own; return the function that stops
    it (and writes collected.json) and the one that counts the peers that shipped."""
    import asyncio
    import threading

    from coordinator_free.cluster import shiplogs

    key = roster_mod.load_private_key(key_path)
    ros = roster_mod.load_roster(rundir.roster_path(run_dir))
    col = shiplogs.LogCollector(run_dir, key, ros, say=lambda m: print(m, flush=True))
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop: list = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        bound = loop.run_until_complete(col.start(port=port))
        print(f"auditor: collecting the peers' logs on port {bound}", flush=True)
        stop.append(loop.create_future())
        started.set()
        loop.run_until_complete(stop[0])
        loop.run_until_complete(col.close())
        loop.close()

    thread = threading.Thread(target=serve, name="log-collector", daemon=True)
    thread.start()
    if not started.wait(30):
        raise ComposeError(f"the log collector did not start on port {port}")

    def finish() -> None:
        loop.call_soon_threadsafe(stop[0].set_result, None)
        thread.join(30)

    return finish, lambda: len(col.record)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m coordinator_free.cluster.compose",
        description="Roles of the peer image in a compose cluster (called by its entrypoint).",
    )
    sub = parser.add_subparsers(dest="role", required=True)
    p = sub.add_parser("keygen", help="keys into /cfree/keys/<i>, roster and config into the run")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--port", type=int, default=PORT)
    p = sub.add_parser("audit", help="audit the run directory, write audit.json")
    p.add_argument(
        "--wait-for",
        type=int,
        metavar="N",
        help="first wait until N peers have a result, or one has and the run directory stayed "
        "untouched for --idle seconds, or --timeout passed",
    )
    p.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS")
    p.add_argument("--idle", type=float, metavar="SECONDS", help="default: 3 step deadlines + 10")
    p.add_argument(
        "--collect-key",
        type=Path,
        metavar="KEY",
        help="while waiting, receive the peers' shipped logs and results (the collector's "
        "private key; peers run with --ship-to)",
    )
    p.add_argument("--collect-port", type=int, default=7001, metavar="PORT")
    args = parser.parse_args(argv)
    from coordinator_free.accounting.audit import AuditError

    if args.role == "keygen":
        return keygen_main(args.nodes, args.port)
    try:
        audit_role(
            wait_for=args.wait_for,
            timeout_s=args.timeout,
            idle_s=args.idle,
            collect_key=args.collect_key,
            collect_port=args.collect_port,
        )
    except (AuditError, config_mod.ConfigError, roster_mod.RosterError, OSError) as exc:
        print(f"cfree {args.role}: {exc}", file=sys.stderr)
        return 2
    return 0


def keygen_main(
    n: int,
    port: int,
    *,
    config_path: Path = Path(CONFIG_MOUNT),
    run_dir: Path = Path(RUN_MOUNT),
    keys_root: Path = Path(KEYS_ROOT),
) -> int:
    """The keygen service's exit status: 0 when it made the keys, and also when it refused and
    could leave the reason in every key volume (the peers then print it and do not start); 2
    when it could not even do that."""
    try:
        ros = keygen_role(n, port, config_path=config_path, run_dir=run_dir, keys_root=keys_root)
    except (ComposeError, config_mod.ConfigError, roster_mod.RosterError, OSError) as exc:
        reason = f"keygen made no keys: {exc}"
        print(f"cfree {reason}", file=sys.stderr)
        try:
            refuse_peers(n, reason, keys_root)
        except OSError as also:
            print(f"cfree keygen: cannot tell the peers why: {also}", file=sys.stderr)
            return 2
        print("cfree keygen: every peer will print this reason and stop", file=sys.stderr)
        return 0
    print(f"keygen: run {ros.run_id}: {n} keys (one per volume), roster and config in {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
