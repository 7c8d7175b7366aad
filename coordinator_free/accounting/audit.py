"""Privacy planning (public parameters only) and auditing (replaying a finished run's view logs),
for every protocol: the entry points the CLI, the launchers and the tests call. Each one finds the
protocol's family through the registry and hands it the work; the units, the log reading and the
calibration search they share are in ``accounting.core``.

``plan_report`` assumes the fault-free schedule. ``audit_run`` rebuilds the schedule that really
happened from the logs (which values every node used at every step, missed deadlines included,
and which messages every observer saw, late ones included), then computes the same quantities
for it.
"""

from __future__ import annotations

import math
from pathlib import Path

from coordinator_free import config as config_mod
from coordinator_free import rundir
from coordinator_free.accounting.core import (  # noqa: F401  (the accounting API in one place)
    BUDGETS,
    METHODS,
    AuditError,
    Units,
    read_logs,
    smallest_sigma,
    units_of,
    write_json,
)
from coordinator_free.families import family_of


def load_run(run_dir: Path):
    """The config and the public plan of a run directory."""
    cfg_path = rundir.config_path(run_dir)
    if not cfg_path.is_file():
        raise AuditError(f"{run_dir} is not a run directory: no config.toml")
    cfg = config_mod.load(cfg_path)
    return cfg, family_of(cfg.protocol.name).make_plan(cfg)


def plan_report(cfg: config_mod.Config, *, source: int | None, method: str) -> dict:
    """What each observer will learn about each source under the fault-free schedule."""
    fam = family_of(cfg.protocol.name)
    return fam.plan_report(cfg, fam.make_plan(cfg), source=source, method=method)


def audit_run(run_dir: str | Path, *, observers: list[int] | None = None) -> dict:
    """The losses every observer experienced, from the view logs of ``run_dir``."""
    run_dir = Path(run_dir)
    cfg, plan = load_run(run_dir)
    return family_of(cfg.protocol.name).audit(run_dir, cfg, plan, observers)


def calibrate(
    cfg: config_mod.Config, target_eps: float, *, method: str, budget: str, decor_pair: str = "mid"
) -> dict:
    """The noise that meets ``target_eps`` for the worst pair (``budget="worst"``) or the mean
    over pairs (``budget="mean"``), searched by the protocol's family."""
    if not target_eps > 0 or not math.isfinite(target_eps):
        raise AuditError(f"--target-eps must be a positive number, got {target_eps}")
    if budget not in BUDGETS:
        raise AuditError(f"unknown budget {budget!r}; expected one of {BUDGETS}")
    return family_of(cfg.protocol.name).calibrate(
        cfg, target_eps, method=method, budget=budget, decor_pair=decor_pair
    )
