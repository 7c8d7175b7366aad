"""Helpers every command module shares: config arguments, output, the usage error, SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal

from coordinator_free.accounting.render import fmt as _fmt
from coordinator_free.accounting.render import table as _table
from coordinator_free.errors import UsageError
from coordinator_free.helptext import HelpFormatter, examples  # noqa: F401 (re-exported)
from coordinator_free.rundir import dumps_json

__all__ = [
    "CliError",
    "_cancel_on_sigterm",
    "_emit",
    "_fmt",
    "_table",
    "add_config_args",
    "coalition",
    "node_ids",
]


class CliError(UsageError):
    """A command-line argument (or combination) that cannot be used: exit 2."""


def node_ids(text: str, flag: str, n: int | None = None) -> list[int]:
    """``A,B,...`` as sorted distinct node ids (in 0..n-1 when n is given)."""
    try:
        ids = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise CliError(f"{flag} {text!r}: expected node ids separated by commas") from None
    if not ids:
        raise CliError(f"{flag}: name at least one node")
    bad = [i for i in ids if n is not None and not 0 <= i < n]
    if bad:
        raise CliError(f"{flag}: node(s) {bad} out of range 0..{n - 1}")
    return ids


def coalition(args, family, compute, printer=None) -> int:
    """``--observers A,B,...`` of plan and audit (and ``--coalition-growth``): the family's
    coalition report, printed (``printer``, default ``family.print_coalition``) or as JSON; a
    family without coalition accounting is refused with its name."""
    try:
        rep = compute()
    except NotImplementedError as exc:
        raise CliError(str(exc)) from None
    return _emit(args, rep, printer or family.print_coalition)


def add_config_args(
    p: argparse.ArgumentParser, optional: bool = True, *, showcase: bool = False
) -> None:
    """The experiment config positional and its ``--set`` overrides. Without a config the
    command runs the 8-peer ring (one host, container or namespace per peer); ``showcase``:
    the 64-peer hypercube of ``cfree run``, ``plan`` and ``simulate`` instead."""
    default = (
        "Muffliato on a 64-node hypercube (coordinator_free/examples/muffliato-hypercube.toml)"
        if showcase
        else "Muffliato on a ring of 8 (coordinator_free/examples/muffliato-ring.toml)"
    )
    p.add_argument(
        "config",
        nargs="?" if optional else None,
        help=f"experiment config (TOML); without it the built-in default: {default}"
        if optional
        else "experiment config (TOML)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config key, e.g. --set graph.nodes=16 (repeatable; value parsed as TOML)",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault (repeatable; appended to the config's faults.inject): kill:N@STEP, "
        "stop:N@STEP+SECONDS, cut:N@STEP, heal:N@STEP, nan:N@STEP, drop:P, duplicate:P, "
        "delay:MS, corrupt:P, dropout:P; see docs/faults.md",
    )


# The name the lab command (and older callers) know it by.
_add_config_args = add_config_args


def add_deploy_args(p) -> None:
    """The flags `cfree k8s` and `cfree stack` share: the peers' port, when the auditor gives up
    waiting, and JSON output."""
    p.add_argument("--port", type=int, default=7000, help="the peers' port (default 7000)")
    p.add_argument(
        "--audit-after",
        type=int,
        metavar="SECONDS",
        help="the auditor audits once every peer has a result, or after this long (default: "
        "the peers' own deadline)",
    )
    p.add_argument("--json", action="store_true", help="print what was written as JSON")


def deploy_config(args, command: str, carrier: str):
    """The config of `cfree k8s` / `cfree stack` (``command``), checked for what their output
    (``carrier``, e.g. "the manifests") can hold: a valid port, and no graph or data file."""
    from coordinator_free import config as config_mod

    cfg = config_mod.load(args.config, args.set, args.fault)
    if not 1 <= args.port <= 65535:
        raise CliError(f"--port {args.port} is not in 1..65535")
    if cfg.graph.path or getattr(cfg.data, "path", None):
        raise CliError(
            f"cfree {command}: this config reads a file (graph.path or data.path), which "
            f"{carrier} does not carry; use cfree compose, or a config without files"
        )
    return cfg


def _emit(args, report: dict, printer) -> int:
    """JSON on stdout with --json, else the human rendering."""
    if args.json:
        print(dumps_json(report))
    else:
        printer(report)
    return 0


async def _cancel_on_sigterm(coro, after=None):
    """SIGTERM ends the run like Ctrl-C: the main task is cancelled (so the launcher stops every
    peer it started) and the command ends as interrupted. ``after``: an :class:`AfterPeers`
    whose ``peers_done()`` says every peer has finished; a SIGTERM then is only noted there
    (the launcher collects the exits, the command writes its summary and ends cleanly)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    terminated = False

    def on_term() -> None:
        nonlocal terminated
        if after is not None and after.peers_done():
            after.terminated = True
            return
        terminated = True
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_term)
    try:
        return await coro
    except asyncio.CancelledError:
        if terminated:
            raise KeyboardInterrupt from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


class Terminated(Exception):
    """SIGTERM arrived while :class:`AfterPeers` lets it interrupt (the audit)."""


class AfterPeers:
    """SIGTERM once every peer has finished is a clean exit, not a kill (rc -15, no message,
    an audit.json without its summary.json). While the summary is put together it is only
    noted; during the audit (``with term.interruptible():``) it raises :class:`Terminated`, so
    the command can still write summary.json (without the audit) and end as usual."""

    def __init__(self, peers_done=lambda: True) -> None:
        self.peers_done = peers_done
        self.terminated = False
        self._raising = False
        self._old = None

    def _on_term(self, signum, frame) -> None:
        self.terminated = True
        if self._raising:
            self._raising = False
            raise Terminated

    def __enter__(self) -> AfterPeers:
        self._old = signal.signal(signal.SIGTERM, self._on_term)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGTERM, self._old if self._old is not None else signal.SIG_DFL)

    def interruptible(self):
        """A context in which SIGTERM raises :class:`Terminated` (at once if one came before)."""
        import contextlib

        @contextlib.contextmanager
        def ctx():
            if self.terminated:
                raise Terminated
            self._raising = True
            try:
                yield
            finally:
                self._raising = False

        return ctx()
