"""The launcher's side of declared faults (:mod:`coordinator_free.faults`): kill, stop, cut and
heal, fired on the peers' progress reports.

:class:`FaultSchedule` is the ``on_event`` callback of a launcher (``cfree run``,
``cfree lab run``). It learns each peer's process id from its first report, and when a fault is
due it acts on the process: ``kill`` sends SIGKILL; ``stop`` sends SIGSTOP and, SECONDS later,
SIGCONT; ``cut`` and ``heal`` call the launcher's link functions (the lab pulls and restores the
host's cable) or, on loopback, send the peer SIGUSR1 / SIGUSR2, on which its transport blocks /
unblocks every neighbour (no frame passes either way, as with a pulled cable).

Everything that fired is kept in ``injected`` (what, to whom, at which reported step, how long
into the run), what never took effect (and why) in ``not_applied()``, failures in ``errors``; the launcher
writes them to the run directory's ``faults.json``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable

from coordinator_free import faults as faults_mod
from coordinator_free import rundir
from coordinator_free.faults import FaultPlan, StepTriggers

#: The signals a peer's transport answers with blocking (cut) / unblocking (heal) its links.
CUT_SIGNAL = signal.SIGUSR1
HEAL_SIGNAL = signal.SIGUSR2


class FaultSchedule:
    def __init__(
        self,
        fp: FaultPlan,
        *,
        global_steps: bool,
        cut: Callable[[int], None] | None = None,
        heal: Callable[[int], None] | None = None,
        announce: bool = False,
        on_fired: Callable[[str, int], None] | None = None,
    ):
        self.triggers = StepTriggers.of(fp, ("kill", "stop", "cut", "heal"), global_steps)
        self.plan = fp
        self.global_steps = global_steps
        self.declared = fp.specs
        self.pids: dict[int, int] = {}
        self.finished: set[int] = set()  # the peers that reported they finished
        self.injected: list[dict] = []
        self.errors: list[str] = []
        self.announce = announce
        self._cut = cut
        self._heal = heal
        self._on_fired = on_fired
        self.t0 = time.monotonic()

    @property
    def needs_steps(self) -> bool:
        """Whether this schedule acts on step events (a kill/stop/cut/heal is declared): the
        launcher then has every peer report every step."""
        return bool(self.triggers.pending or self.triggers.fired)

    def __call__(self, node: int, ev: dict, pid: int) -> None:
        self.pids.setdefault(node, pid)
        if ev.get("event") == "finished":
            self.finished.add(node)
        for fault in self.triggers.fire(node, ev):
            self._apply(fault, node, ev)

    def _signal(self, node: int, sig: signal.Signals) -> None:
        pid = self.pids.get(node)
        if pid is None:
            raise ProcessLookupError(f"node {node} has not started (no process to signal)")
        os.kill(pid, sig)

    def _apply(self, fault, by: int, ev: dict) -> None:
        v = fault.node
        t = time.monotonic() - self.t0
        try:
            if fault.kind == "kill":
                self._signal(v, signal.SIGKILL)
            elif fault.kind == "stop":
                self._signal(v, signal.SIGSTOP)
                asyncio.get_running_loop().call_later(fault.seconds, self._resume, v)
            elif fault.kind == "cut":
                (self._cut or (lambda x: self._signal(x, CUT_SIGNAL)))(v)
            elif fault.kind == "heal":
                (self._heal or (lambda x: self._signal(x, HEAL_SIGNAL)))(v)
        except (OSError, RuntimeError) as exc:
            self.errors.append(f"{fault.spec}: {exc}")
            return
        step = ev.get("step", 0) if ev.get("event") == "step" else 0
        self.injected.append(
            {"fault": fault.kind, "spec": fault.spec, "node": v, "step": step,
             "reported_by": by, "t_s": round(t, 3)}
        )  # fmt: skip
        if self._on_fired is not None:
            self._on_fired(fault.kind, v)
        if self.announce:
            sys.stderr.write(
                ("\r" if sys.stderr.isatty() else "")
                + f"  fault: {fault.spec} (node {by} reported step {step}, {t:.1f}s)\n"
            )

    def _resume(self, node: int) -> None:
        try:
            self._signal(node, signal.SIGCONT)
        except OSError as exc:  # it died meanwhile
            self.errors.append(f"resume node {node}: {exc}")
            return
        self.injected.append(
            {"fault": "resume", "node": node, "t_s": round(time.monotonic() - self.t0, 3)}
        )

    def never_fired(self) -> list[str]:
        return [f.spec for f in self.triggers.never_fired()]

    def not_applied(self, peer_injected: dict[int, dict], results: dict) -> list[dict]:
        """The declared node faults that never took effect, with why (see
        :func:`coordinator_free.faults.not_applied`): the launcher's that no report reached, and
        the ``nan`` ones no peer says it applied."""
        nan_sent: dict[int, set[int]] = {}
        for v, inj in peer_injected.items():
            for x in (inj or {}).get("nan") or []:
                if isinstance(x, dict) and isinstance(x.get("step"), int):
                    nan_sent.setdefault(v, set()).add(x["step"])
        return faults_mod.not_applied(
            self.plan,
            launcher_pending=self.triggers.never_fired(),
            nan_sent=nan_sent,
            reached=faults_mod.last_steps(results, global_steps=self.global_steps),
            global_steps=self.global_steps,
        )

    def record(
        self, out_dir, peer_injected: dict[int, dict] | None = None, results: dict | None = None
    ) -> dict:
        """What faults.json holds: the declared faults, what the launcher injected and when,
        what each peer's transport injected (counts), what never took effect and why (each
        ``{"spec", "fault", "node", "step", "reason"}``; ``results``: every node's result,
        None where it has none), errors."""
        peer_injected = peer_injected or {}
        doc = {
            "declared": self.declared,
            "injected": self.injected,
            "peers": {str(v): x for v, x in sorted(peer_injected.items()) if x},
            "not_applied": self.not_applied(peer_injected, results or {}),
            "errors": self.errors,
        }
        rundir.write_json(rundir.faults_path(out_dir), doc)
        return doc
