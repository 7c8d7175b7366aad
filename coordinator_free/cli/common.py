"""Helpers shared by the commands: the CLI's own error, config arguments, JSON-or-text output, the
learning summary table, token outcomes, Ctrl-C and SIGTERM handling."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

import numpy as np

from coordinator_free.accounting.render import fmt as _fmt
from coordinator_free.accounting.render import table as _table
from coordinator_free.errors import CfreeError


class CliError(CfreeError):
    pass


def _add_config_args(p: argparse.ArgumentParser, optional: bool = True) -> None:
    p.add_argument(
        "config",
        nargs="?" if optional else None,
        help="experiment config (TOML); without it the built-in default: Muffliato on a ring of 8"
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


def _emit(args, report: dict, printer) -> int:
    """JSON on stdout with --json, else the human rendering."""
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        printer(report)
    return 0


def _token_quality(t: dict) -> str:
    """What a finished token is worth: test accuracy and loss, or its error."""
    if "test_accuracy" in t:
        acc = "-" if t["test_accuracy"] is None else f"{t['test_accuracy']:.4f}"
        return f"test acc {acc}, test loss {_fmt(t['test_loss'])}"
    if "error" in t:
        est = np.array2string(np.asarray(t["estimate"]), precision=3)
        return f"estimate {est}, |estimate - truth| = {_fmt(t['error'])}"
    return "-"


def _print_learning_summary(summary: dict) -> None:
    res = summary["results"]
    metrics = res["metrics"]
    if res["nodes"]:
        rows = []
        for r in res["nodes"]:
            if not r["finished"]:
                rows.append([str(r["node"]), "-", "-", "-", "-", "did not finish"])
                continue
            acc = "-" if r["test_accuracy"] is None else f"{r['test_accuracy']:.4f}"
            rows.append(
                [str(r["node"]), acc, _fmt(r["test_loss"]), f"{r['steps_per_s']:.1f}",
                 str(r["bytes_sent"]), str(r["missed"])]
            )  # fmt: skip
        print()
        print(_table(["node", "test acc", "test loss", "steps/s", "bytes sent", "missed"], rows))
    if metrics:
        every = max(1, (len(metrics) - 1) // 10)
        shown = [m for m in metrics if m["round"] % every == 0 or m is metrics[-1]]
        rows = [
            [str(m["round"]),
             "-" if m["avg_test_accuracy"] is None else f"{m['avg_test_accuracy']:.4f}",
             _fmt(m["avg_test_loss"]), _fmt(m["avg_train_loss"]),
             "-" if m["node_test_accuracy_min"] is None
             else f"{m['node_test_accuracy_min']:.3f}..{m['node_test_accuracy_max']:.3f}",
             _fmt(m["consensus_distance"])]
            for m in shown
        ]  # fmt: skip
        print("\nnode-average model by round (metrics.jsonl has every round):")
        print(
            _table(
                ["round", "test acc", "test loss", "train loss", "node acc range", "spread"], rows
            )
        )


def walk_outcomes(cfg, plan, traces) -> list[dict]:
    """Per token: where it ended, its final value, and what it is worth (|estimate - truth| for
    sums and histograms, test accuracy and loss for models)."""
    from coordinator_free.families.walk import protocol as wk

    task = None
    if plan.kind == "sgd":
        from coordinator_free.families.learning import protocol as lp

        task = lp.make_task(cfg, plan.n)
    out = []
    for t in traces:
        row = {
            "token": t.token,
            "end": {"how": "completed", "at": t.holders[-1], "step": len(t.holders)},
            "final": t.final.tolist(),
            "contributions": int(np.sum(t.data)),
        }
        if task is not None:
            ds, model = task.dataset, task.model
            row["test_accuracy"] = model.accuracy(t.final, ds.X_test, ds.y_test)
            row["test_loss"] = float(model.loss(t.final, ds.X_test, ds.y_test))
        else:
            est = wk.estimate(plan, t.final)
            row.update(estimate=est.tolist(), truth=t.truth.tolist(),
                       error=float(np.linalg.norm(est - t.truth)))  # fmt: skip
        out.append(row)
    return out


async def _cancel_on_sigterm(coro):
    """SIGTERM ends the run like Ctrl-C: the main task is cancelled (so the launcher stops every
    peer it started) and the command ends as interrupted."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    terminated = False

    def on_term() -> None:
        nonlocal terminated
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
