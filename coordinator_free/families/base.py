"""The interface every protocol family implements, and what the rest of the package may ask of it.

A family is one package under ``coordinator_free/families/`` holding its math (``protocol.py``:
the plan and the pure update rules), its node program (``node.py``: a sans-IO engine program fed
events and time, giving actions), its accountant glue (``accountant.py``: plan report, audit of a
run directory, calibration) and its rendering (``render.py``: what the CLI prints). The peer
runner, the simulator, the auditor, the CLI and the launchers reach a family only through
:func:`coordinator_free.families.family_of`; nothing outside ``families/`` compares protocol
names.

Adding a protocol: a new package with a subclass of :class:`Family`, registered in
``families/__init__.py`` (docs/architecture.md walks through one).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any


class Family:
    """One protocol family. Subclasses set ``name`` and ``protocols`` and override the methods
    their protocols support; the defaults say plainly what is not supported."""

    #: The family's id (``averaging``, ``randomized``, ``learning``, ``walk``, ``decor``).
    name: str = ""
    #: The values of ``protocol.name`` this family serves.
    protocols: tuple[str, ...] = ()
    #: Whether ``protocol.tick`` paces Poisson clocks (randomized gossip).
    clocks: bool = False
    #: Whether the protocol adds pairwise-correlated noise (``privacy.sigma_cor``, collusion).
    correlated_noise: bool = False
    #: The keys of ``config.FAMILY_KEYS`` this family reads (the others are refused).
    own_keys: tuple[str, ...] = ()

    # ------------------------------------------------------------------ what kind of protocol

    def privacy_units(self, cfg) -> tuple[str, ...]:
        """The values ``privacy.unit`` may take for this config (what neighbouring datasets differ
        in); every protocol is accounted at user level unless its family says more."""
        return ("user",)

    def learns(self, cfg) -> bool:
        """True when the protocol trains a model from per-node data shards."""
        return False

    def walks(self, cfg) -> bool:
        """True when a token walks the graph (token forwarding) instead of gossip steps."""
        return False

    def has_peers(self, cfg) -> bool:
        """False for protocols that run in one process (the trusted-curator baseline)."""
        return True

    def dropout(self, cfg) -> bool:
        """True when the protocol's public schedule can include per-step node dropout
        (``--fault dropout:P``): the plan, the peers and the auditor then agree on who sits
        out of which step."""
        return False

    def sensitivity(self, cfg) -> float:
        """The L2 sensitivity in use when ``privacy.sensitivity`` is not set."""
        return 1.0

    def accepts_no_noise(self, cfg) -> bool:
        """True when ``privacy.sigma = 0`` is accepted (plain gossip or plain D-GD, no privacy,
        to show what ``cfree attack`` reconstructs without noise): the protocols
        ``catalog.NO_NOISE`` lists."""
        from coordinator_free.families import catalog

        return cfg.protocol.name in catalog.NO_NOISE

    # ------------------------------------------------------------------ config and plan

    def validate(self, cfg, source: str) -> None:
        """Check the family's own keys; raise ConfigError naming ``source`` and the key."""

    def make_plan(self, cfg):
        raise NotImplementedError(f"{self.name}: make_plan")

    # ------------------------------------------------------------------ running

    def node_engine(self, cfg, plan, node: int, streams):
        """The sans-IO engine of one node (``coordinator_free.engine``): the family's node
        program, fed events and time by the peer shell or the in-memory network."""
        raise NotImplementedError(f"{self.name}: node_engine")

    def run_one_process(self, cfg, out: Path, streams) -> tuple[dict, Any]:
        """``cfree run`` of a protocol without peers (:meth:`has_peers` False): run it in this
        process with the secret ``streams``, write its outputs into the run directory ``out``
        and return (the summary's ``results``, the plan)."""
        raise NotImplementedError(f"{self.name}: run_one_process")

    def simulate(self, cfg, plan=None, streams=None, **opts: Any):
        """A fault-free run in one process, with the node programs the peers run."""
        raise NotImplementedError(f"{self.name}: simulate")

    # ------------------------------------------------------------------ accounting

    def plan_report(self, cfg, plan, *, source: int | None, method: str) -> dict:
        raise NotImplementedError(f"{self.name}: plan_report")

    def audit(self, run_dir: Path, cfg, plan, observers: list[int] | None) -> dict:
        raise NotImplementedError(f"{self.name}: audit")

    def calibrate(self, cfg, target_eps: float, *, method: str, budget: str, **opts: Any) -> dict:
        raise NotImplementedError(f"{self.name}: calibrate")

    def planned_losses(
        self, cfg, plan, observers: list[int]
    ) -> dict[int, dict[tuple[int, str], dict]]:
        """Observer -> {(source, method): {"factor": float | None, "rdp": float | None,
        "eps": float}} under the fault-free plan (the numbers ``cfree plan --json`` gives),
        for the methods ``exact`` and ``paper``. An entry may carry more keys (``distance``):
        the audit copies them into an entry it has to create. The audit of a run with damaged
        or missing logs never reports less than these."""
        raise NotImplementedError(
            f"{self.name}: planned_losses (the fault-free losses an audit of damaged logs is "
            "floored at) is not implemented for this family"
        )

    def coalition_plan(self, cfg, plan, observers: list[int]) -> dict:
        """``cfree plan --observers``: the loss of every source outside a coalition towards its
        joint view, one row per source (``observers``, ``source``, ``factor``, ``rdp``,
        ``eps``)."""
        raise NotImplementedError(self._no_coalitions(cfg))

    def coalition_audit(self, run_dir: Path, cfg, plan, observers: list[int]) -> dict:
        """``cfree audit --observers``: :meth:`coalition_plan` for the schedule the members'
        logs show; never below the plan's when logs are damaged or missing."""
        raise NotImplementedError(self._no_coalitions(cfg))

    def attack(self, run_dir: Path, cfg, plan, attackers: list[int], logs: dict) -> dict:
        """``cfree attack``: what the coalition reconstructs from its members' view logs
        (``logs``: member -> read view log), as ``{"attackers": [...], "nodes": [{"node",
        "reconstructed", "error", ...}, ...], ...}``."""
        raise NotImplementedError(
            f"cfree attack reconstructs gossip averaging (muffliato) and gradient descent over "
            f"gossip (dsgd, muffliato-gd); protocol {cfg.protocol.name} is not covered"
        )

    def print_attack(self, result: dict) -> None:
        self._render("print_attack")(result)

    def coalition_growth(self, cfg, plan, k: int, join: str) -> dict:
        """``cfree plan --coalition-growth K``: the worst and mean loss of the nodes outside a
        coalition as 1..K colluders join (``join``: ``greedy`` or ``degree``), from
        :meth:`coalition_plan`."""
        from coordinator_free.accounting.coalition import growth_report

        return growth_report(
            cfg, plan, k, join, lambda members: self.coalition_plan(cfg, plan, members)
        )

    def print_coalition(self, rep: dict) -> None:
        from coordinator_free.accounting.coalition import print_report

        print_report(rep)

    def print_growth(self, rep: dict) -> None:
        from coordinator_free.accounting.coalition import print_growth

        print_growth(rep)

    def _no_coalitions(self, cfg) -> str:
        return (
            f"colluding observers are not accounted for protocol {cfg.protocol.name}: it "
            "reports single observers (--observer / --source); docs/attacks.md lists the "
            "protocols with coalitions"
        )

    def worst_case_losses(
        self, cfg, plan, observers: list[int]
    ) -> dict[int, dict[tuple[int, str], dict]]:
        """The shape of :meth:`planned_losses`, for observers about which nothing is known
        (their log is missing, unreadable, headerless or of another run): for each entry the
        larger of the planned loss and the local-DP loss of the source's releases."""
        raise NotImplementedError(
            f"{self.name}: worst_case_losses (the loss reported for an observer whose log is "
            "missing or unusable) is not implemented for this family"
        )

    # ------------------------------------------------------------------ rendering (CLI output)

    def banner(self, cfg, plan) -> str:
        """One line that says what a run of this config is about to do."""
        return f"starting {plan.n} peers: {cfg.protocol.name} on {cfg.graph.kind}"

    #: The module of the family's rendering functions (``print_plan``, ``print_audit``, ...,
    #: ``simulator_diff``, ``simulation``, ``print_simulation``), imported on first use;
    #: ``render_from`` names another module for a function the family borrows.
    render_module: str = ""
    render_from: dict[str, str] = {}

    def _render(self, function: str):
        module = self.render_from.get(function, self.render_module)
        if not module:
            raise NotImplementedError(f"{self.name}: {function}")
        return getattr(importlib.import_module(module), function)

    def print_plan(self, rep: dict) -> None:
        """``cfree plan``: the plan report for people."""
        self._render("print_plan")(rep)

    def print_audit(self, rep: dict) -> None:
        """``cfree audit``: the audit report for people."""
        self._render("print_audit")(rep)

    def print_calibration(self, rep: dict) -> None:
        """``cfree plan --target-eps``: the calibration for people."""
        self._render("print_calibration")(rep)

    def print_summary(self, summary: dict, audit: dict | None) -> None:
        """``cfree run``: the run summary (and the audit's verdict) for people."""
        self._render("print_summary")(summary, audit)

    # ------------------------------------------------------------------ rendering of runs

    def print_audit_compact(self, audit: dict) -> None:
        """The audit as a run summary ends with it: pairwise eps by graph distance."""
        self._render("print_audit_compact")(audit)

    def simulate_as_peers(self, cfg, plan=None, streams=None, **opts: Any):
        """:meth:`simulate` with the peers' arithmetic: BLAS on one thread, as every peer runs
        (:mod:`coordinator_free.blas`), so a fault-free run equals it bit for bit."""
        from coordinator_free.blas import one_thread

        with one_thread():
            return self.simulate(cfg, plan, streams, **opts)

    def simulator_diff(self, cfg, plan, run_dir: Path, results: dict, streams) -> float | None:
        """max |networked run - simulator| given the run's node streams (None when nothing
        finished); may annotate ``results`` with the simulator's verdict."""
        return self._render("simulator_diff")(
            cfg, plan, run_dir, results, lambda: self.simulate_as_peers(cfg, None, streams)
        )

    def simulation(self, cfg, streams) -> dict:
        """``cfree simulate --json``: the reference simulator's outcome (with the
        :meth:`reference` a result is judged against, when the family has one)."""
        out = self._render("simulation")(cfg, self.simulate_as_peers(cfg, None, streams))
        ref = self.reference(cfg)
        if ref is not None:
            out["reference"] = ref
        return out

    def reference(self, cfg) -> dict | None:
        """What a trained model is judged against (``families/learning/reference.py``): the
        same config without noise and the trivial model; None when the protocol learns no
        model (an estimate is judged against the truth its results carry)."""
        return None

    def yardstick(self, cfg, plan, summary: dict) -> dict | None:
        """What the run's result is judged against (``coordinator_free/yardstick.py``,
        docs/yardstick.md): ``{measured, expected, ratio, far, ...}``. By default a trained
        model's final test loss against the noise-free reference of ``summary``."""
        from coordinator_free import yardstick

        res = summary["results"]
        if res.get("central"):
            last = {"avg_test_loss": res["central"]["test_loss"],
                    "avg_test_accuracy": res["central"]["test_accuracy"]}  # fmt: skip
        elif res.get("metrics"):
            last = res["metrics"][-1]
        else:
            last = {"avg_test_loss": None, "avg_test_accuracy": None}
        return yardstick.learning(
            last["avg_test_loss"], last["avg_test_accuracy"], summary.get("reference")
        )

    def print_simulation(self, out: dict) -> None:
        self._render("print_simulation")(out)

    def __repr__(self) -> str:
        return f"<family {self.name}: {', '.join(self.protocols)}>"
