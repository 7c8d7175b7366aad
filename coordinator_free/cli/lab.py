"""``cfree lab``: a network-namespace lab, one isolated host per node on a virtual switch, so a
run crosses a real network stack (see docs/lab.md and ``coordinator_free.cluster.netns``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from coordinator_free import rundir
from coordinator_free.cli.common import HelpFormatter
from coordinator_free.cluster import netns

LAB_EPILOG = """\
examples (as root):
  cfree lab up --nodes 8                 # hosts cfree-h0..cfree-h7 at 10.213.0.1..8, switch cfree-sw
  cfree lab status
  cfree lab run examples/muffliato-ring.toml --cut 3@2 --set protocol.steps=20 --set network.deadline_s=1  # exit 1: node 3's cable pulled after step 2
  ip netns exec cfree-h0 ss -tn          # any command runs on a host
  cfree lab cut 3 && cfree lab heal 3
  cfree lab down
  cfree lab run --set graph.nodes=4      # no lab up: a temporary one, removed when the run ends
"""


def _node_at_step(text: str) -> tuple[int, int]:
    node, sep, step = text.partition("@")
    if not sep or not node.strip().isdigit() or not step.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not NODE@STEP (e.g. 3@2)")
    return int(node), int(step)


def _add_name(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--name",
        default=netns.DEFAULT_NAME,
        help=f"lab name: its namespaces are NAME-sw and NAME-h<i> (default: {netns.DEFAULT_NAME})",
    )


def add_lab_parser(sub) -> None:
    """Add ``lab`` and its actions to the ``cfree`` subcommands ``sub``."""
    from coordinator_free.cli.common import _add_config_args

    lab = sub.add_parser(
        "lab",
        help="a network-namespace lab: one isolated host per node, real network between them "
        "(root)",
        description="Create N isolated hosts (Linux network namespaces NAME-h0..NAME-h<N-1>, "
        "each with its own eth0 and address) joined by a virtual switch (namespace NAME-sw, "
        "bridge br0), run one peer per host over real IP and TCP, and cut or heal a host's "
        "link like a pulled cable. The machine's own network is never touched. Needs root "
        "and iproute2.",
        epilog=LAB_EPILOG,
        formatter_class=HelpFormatter,
    )
    lab.set_defaults(lab_help=lab.print_help)
    acts = lab.add_subparsers(dest="lab_command", metavar="ACTION")

    p = acts.add_parser(
        "up",
        help="create the lab's namespaces, switch and links",
        description="Create hosts NAME-h0..NAME-h<N-1>; host i's eth0 gets the (i+1)-th "
        "address of --subnet and is cabled to port veth<i> of bridge br0 in NAME-sw. Refuses "
        "if a lab of that name exists. The lab stays until `cfree lab down`.",
    )
    p.add_argument("--nodes", type=int, required=True, help="number of hosts")
    _add_name(p)
    p.add_argument(
        "--subnet",
        default=netns.DEFAULT_SUBNET,
        help=f"IPv4 subnet of the hosts (default: {netns.DEFAULT_SUBNET})",
    )
    p.add_argument("--json", action="store_true", help="print the lab's record as JSON")

    p = acts.add_parser(
        "down",
        help="remove the lab (idempotent)",
        description="Stop whatever still runs on the lab's hosts, delete its namespaces (every "
        "NAME-sw and NAME-h<i>, even if the lab's record is missing or damaged) and its record. "
        "Removing a lab that does not exist is not an error.",
    )
    _add_name(p)

    p = acts.add_parser(
        "status",
        help="show the labs: hosts, addresses, links, processes",
        description="For every lab (or only --name): each host's namespace, address, link (up, "
        "cut, or missing) and the number of processes running on it.",
    )
    p.add_argument("--name", help="only this lab (default: every lab)")
    p.add_argument("--json", action="store_true")

    for action, what in (("cut", "cut"), ("heal", "reconnect")):
        p = acts.add_parser(
            action,
            help=f"{what} one host's link to the switch",
            description="Cut: set the switch port of host NODE down, like a pulled cable: every "
            "packet to or from it is dropped, open TCP connections stall without being reset. "
            "Heal: set it up again (stalled connections resume if they have not given up)."
            if action == "cut"
            else "Set the switch port of host NODE up again, undoing `cfree lab cut NODE`: "
            "stalled TCP connections resume if their peers have not given up on them.",
        )
        p.add_argument("node", type=int, help="host (node id)")
        _add_name(p)

    p = acts.add_parser(
        "run",
        help="run an experiment with one peer per lab host",
        description="Like `cfree run`, with node i's peer on host i of the lab, listening on "
        "the host's address: keys and roster, progress, the comparison with the reference "
        "simulator, the audit, summary.json and audit.json in the run directory. Uses the lab "
        "--name if it is up (it needs at least as many hosts as the config has nodes); "
        "otherwise brings up a temporary one of the config's size and removes it when the run "
        "ends, however it ends.",
    )
    _add_config_args(p)
    p.add_argument("--out", type=Path, help="run directory (default: runs/<name>-<time>-<rand>)")
    _add_name(p)
    p.add_argument(
        "--subnet",
        default=netns.DEFAULT_SUBNET,
        help=f"subnet of a temporary lab (default: {netns.DEFAULT_SUBNET})",
    )
    p.add_argument(
        "--port",
        type=int,
        help=f"port every peer listens on (default: network.base_port, or {netns.DEFAULT_PORT})",
    )
    p.add_argument(
        "--cut",
        action="append",
        default=[],
        type=_node_at_step,
        metavar="NODE@STEP",
        help="cut NODE's link once it has reported step STEP (0: once it is connected); the "
        "cluster may be a step further when the link goes down (repeatable)",
    )
    p.add_argument(
        "--heal",
        action="append",
        default=[],
        type=_node_at_step,
        metavar="NODE@STEP",
        help="heal NODE's link once it has reported step STEP (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    from coordinator_free.cli.run import add_memory_arg

    add_memory_arg(p)
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--no-audit", action="store_true", help="skip the audit at the end")


def cmd_lab(args) -> int:
    """Entry point of ``cfree lab``; a lab or launch error is a message on stderr and exit
    status 2."""
    from coordinator_free.cluster.local import LaunchError  # LabError is one

    if args.lab_command is None:
        args.lab_help()
        return 2
    try:
        return _ACTIONS[args.lab_command](args)
    except LaunchError as exc:
        print(f"cfree lab {args.lab_command}: error: {exc}", file=sys.stderr)
        return exc.exit_code


# ------------------------------------------------------------------------------------ actions


def _name_opt(name: str) -> str:
    return "" if name == netns.DEFAULT_NAME else f" --name {name}"


def _hosts_table(rows: list[dict], extra: tuple[str, ...] = ()) -> str:
    from coordinator_free.cli.common import _table

    return _table(
        ["node", "namespace", "address", *extra],
        [[str(h["node"]), h["namespace"], h["address"], *(str(h[k]) for k in extra)]
         for h in rows],
    )  # fmt: skip


def _up(args) -> int:
    lab = netns.up(args.nodes, args.name, args.subnet)
    if args.json:
        print(json.dumps(lab.to_dict(), indent=1))
        return 0
    opt = _name_opt(lab.name)
    print(
        f"lab {lab.name} is up: {lab.n} hosts on {lab.subnet}, switch namespace {lab.switch} "
        f"(bridge {netns.BRIDGE})"
    )
    print(_hosts_table(lab.to_dict()["hosts"]))
    print(
        f"\nrun a command on host 0: ip netns exec {lab.ns(0)} COMMAND\n"
        f"run an experiment:       cfree lab run CONFIG{opt}\n"
        f"remove the lab:          cfree lab down{opt}"
    )
    return 0


def _down(args) -> int:
    r = netns.down(args.name)
    if r.note:
        print(f"cfree lab down: warning: {r.note}", file=sys.stderr)
    if r.stopped:
        print(f"stopped {len(r.stopped)} process(es) still running in the lab")
    if r.namespaces:
        print(f"lab {r.name} removed: {len(r.namespaces)} namespaces ({', '.join(r.namespaces)})")
    elif r.record:
        print(f"lab {r.name} removed (its namespaces were already gone)")
    else:
        print(f"no lab {r.name}: nothing to remove")
    return 0


def _status(args) -> int:
    names = [args.name] if args.name else netns.lab_names()
    reports = [s for s in (netns.status(n) for n in names) if s is not None]
    if args.json:
        print(json.dumps(reports, indent=1))
        return 0 if reports or not args.name else 1
    if not reports:
        print(f"no lab named {args.name!r}" if args.name else "no labs")
        return 1 if args.name else 0
    for i, s in enumerate(reports):
        if i:
            print()
        if not s["record"]:
            what = s.get("damaged") or "no record"
            ns = ", ".join(s["leftovers"]) or "none"
            print(
                f"lab {s['name']}: {what}; its namespaces: {ns}; "
                f"cfree lab down{_name_opt(s['name'])} removes them"
            )
            continue
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s["created"]))
        print(
            f"lab {s['name']}: {len(s['hosts'])} hosts on {s['subnet']}, switch {s['switch']}, "
            f"up since {when}"
        )
        print(_hosts_table(s["hosts"], ("link", "processes")))
        if s["missing"]:
            print(
                f"missing namespace(s): {', '.join(s['missing'])}; the lab is unusable: "
                f"cfree lab down{_name_opt(s['name'])}, then up again"
            )
    return 0


def _cut(args) -> int:
    lab = netns.cut(args.node, args.name)
    print(
        f"cut host {args.node} ({lab.ip(args.node)}) off the switch: port "
        f"{lab.port_name(args.node)} of {lab.switch} is down; heal: cfree lab heal "
        f"{args.node}{_name_opt(lab.name)}"
    )
    return 0


def _heal(args) -> int:
    lab = netns.heal(args.node, args.name)
    print(
        f"healed host {args.node} ({lab.ip(args.node)}): port {lab.port_name(args.node)} of "
        f"{lab.switch} is up"
    )
    return 0


def _link_changes(schedule) -> list[dict]:
    """The cuts and heals the run made, as the lab summary lists them."""
    return [
        {"action": d["fault"], "node": d["node"], "at_step": int(d["spec"].rsplit("@", 1)[1]),
         "reported_step": d["step"], "t_s": d["t_s"]}
        for d in schedule.injected
        if d["fault"] in ("cut", "heal")
    ]  # fmt: skip


def _restore_links(lab: netns.Lab, schedule, already_cut: list[int]) -> None:
    """Leave a lab that outlives the run as the run found it: a link the run cut (and did not
    heal) is healed again."""
    last = {d["node"]: d["action"] for d in _link_changes(schedule)}
    for v, action in sorted(last.items()):
        if action == "cut" and v not in already_cut:
            try:
                lab.heal(v)
            except netns.LabError as exc:
                print(f"cfree lab run: warning: could not heal node {v}: {exc}", file=sys.stderr)


def _run(args) -> int:
    from coordinator_free import config as config_mod
    from coordinator_free.cli.common import _cancel_on_sigterm
    from coordinator_free.cli.run import (
        conclude,
        fault_schedule,
        note_interruption,
        print_problems,
        save_summary,
    )
    from coordinator_free.cluster import local
    from coordinator_free.families import family_of

    flags = [f"cut:{v}@{s}" for v, s in args.cut] + [f"heal:{v}@{s}" for v, s in args.heal]
    cfg = config_mod.load(args.config, args.set, [*args.fault, *flags])
    family = family_of(cfg.protocol.name)
    plan = family.make_plan(cfg)
    if not family.has_peers(cfg):
        raise netns.LabError(
            f"{cfg.protocol.name} is the trusted-curator baseline: one process, no peers to place "
            "on lab hosts (use cfree run)"
        )
    for f in cfg.fault_plan.at_steps():
        if f.step > plan.steps:
            raise netns.LabError(f"--fault {f.spec}: the run has {plan.steps} steps")
    local.check_memory(cfg, plan, spawn="exec", allow=args.no_memory_check)  # lab peers: exec
    netns.check_environment()
    lab = netns.load(args.name)
    if lab is not None and lab.n < plan.n:
        raise netns.LabError(
            f"lab {lab.name!r} has {lab.n} hosts, the config has {plan.n} nodes: "
            f"cfree lab down{_name_opt(lab.name)}, then cfree lab up --nodes {plan.n}"
            f"{_name_opt(lab.name)} (or run with no lab up: a temporary one is made)"
        )
    out = args.out or local.default_run_dir(cfg)
    temporary = lab is None
    if temporary:
        lab = netns.up(plan.n, args.name, args.subnet)
    schedule = fault_schedule(cfg, announce=not args.quiet, cut=lab.cut, heal=lab.heal)
    already_cut: list[int] = []
    try:
        local.prepare_run_dir(cfg, out)
        already_cut = [v for v, up in sorted(lab.links().items()) if not up and v < plan.n]
        if not args.quiet:
            print(f"run directory: {out}", file=sys.stderr)
            print(
                f"lab {lab.name}{' (temporary)' if temporary else ''}: node i on host "
                f"{lab.name}-h<i>, addresses {lab.ip(0)}..{lab.ip(plan.n - 1)}",
                file=sys.stderr,
            )
            if already_cut:
                print(f"note: the link of node(s) {already_cut} is cut", file=sys.stderr)
            print(family.banner(cfg, plan), file=sys.stderr)
        with note_interruption("cfree lab run", out):
            run = asyncio.run(
                _cancel_on_sigterm(
                    netns.launch_peers_in_lab(
                        cfg,
                        out,
                        lab,
                        show_progress=not args.quiet,
                        on_event=schedule,
                        port=args.port,
                    )
                )
            )
    finally:
        if temporary:
            netns.down(lab.name)
        else:
            _restore_links(lab, schedule, already_cut)

    summary, finished = conclude(cfg, plan, out, run, schedule)
    roster = json.loads(rundir.roster_path(out).read_text())
    summary["lab"] = {
        "name": lab.name,
        "temporary": temporary,
        "subnet": lab.subnet,
        "hosts": [
            {
                "node": e["id"],
                "namespace": lab.ns(e["id"]),
                "host": e["host"],
                "port": e["port"],
            }
            for e in roster["nodes"]
        ],  # fmt: skip
        "links": _link_changes(schedule),
        "not_applied": [
            {"action": f.kind, "node": f.node, "at_step": f.step}
            for f in schedule.triggers.never_fired()
            if f.kind in ("cut", "heal")
        ],
        "errors": schedule.errors,
    }
    audit = save_summary(args, out, summary, finished)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(
            f"lab {lab.name}: {plan.n} peers on {lab.ip(0)}..{lab.ip(plan.n - 1)} port "
            f"{roster['nodes'][0]['port']}" + ("" if not temporary else " (temporary lab, removed)")
        )
        for d in _link_changes(schedule):
            print(
                f"  {d['action']} node {d['node']}'s link when it reported step "
                f"{d['reported_step']} ({d['t_s']:.1f}s into the run)"
            )
        if audit is not None and not audit["fault_free"]:
            print("  the run was not fault-free: the audit below is of the schedule that happened")
        family.print_summary(summary, audit)
    print_problems("cfree lab run", summary)
    return 1 if summary["problems"] else 0


_ACTIONS = {"up": _up, "down": _down, "status": _status, "cut": _cut, "heal": _heal, "run": _run}
