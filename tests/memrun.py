"""An in-memory run written as a run directory (config, view logs, results), so the auditor
can read it like a networked run's."""

from __future__ import annotations

import json
from pathlib import Path

from coordinator_free.engine.memnet import MemRun
from coordinator_free.families import family_of
from coordinator_free.peer.runner import PeerResult, node_params
from coordinator_free.viewlog import ViewLogWriter


def write_run_dir(cfg, run: MemRun, out: Path, run_id: str = "memnet") -> Path:
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    (out / "logs").mkdir(parents=True)
    (out / "results").mkdir()
    (out / "config.toml").write_text(cfg.to_toml())
    for v, records in run.logs.items():
        if run.outcome[v] == "never-started":
            continue
        with ViewLogWriter(
            out / "logs" / f"node-{v}.vlog", run_id=run_id, node=v, params=node_params(cfg, plan, v)
        ) as vlog:
            for kind, fields in records:
                vlog.write(kind, **fields)
        res = run.results[v]
        if res is not None:
            result = PeerResult(**res, channels=None)
            (out / "results" / f"node-{v}.json").write_text(json.dumps(result.to_json()))
    return out
