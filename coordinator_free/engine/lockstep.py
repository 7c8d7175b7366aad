"""The simulator's driver of node programs: every node of a fault-free run in one process, in
lockstep, with no network, no clock and no log.

Each program yields the same :class:`~coordinator_free.engine.step.Exchange` requests it yields
to a peer's step engine; the driver answers step t's requests of all the nodes taking part at
once, with every partner's value. Waits are answered at once and a gather finds every neighbour
(nothing is missing in a fault-free run). So the simulator runs the very round loops the peers
run, and a fault-free networked run equals it bit for bit.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from coordinator_free.engine.step import Exchange, Gather, Outcome, Program


def lockstep(
    programs: dict[int, Program],
    partners_at: Callable[[int, int], list[int]],
    on_step: Callable[[int, list[int], dict[int, np.ndarray]], None] | None = None,
) -> dict[int, Outcome]:
    """Run ``programs`` (node -> started generator) to their end. ``partners_at(v, t)``: whose
    values node v receives at step t. ``on_step(t, nodes, current)``: called after step t with
    the nodes that took part and every node's current value (first with t = -1: the values
    the programs start from)."""
    outcomes: dict[int, Outcome] = {}
    requests: dict[int, Exchange] = {}
    current: dict[int, np.ndarray] = {}
    at_step: dict[int, list[int]] = {}
    steps: list[int] = []

    def advance(v: int, answer) -> None:
        gen = programs[v]
        while True:
            try:
                req = gen.send(answer)
            except StopIteration as stop:
                outcomes[v] = stop.value
                current[v] = stop.value.estimate
                return
            if isinstance(req, Exchange):
                requests[v] = req
                current[v] = req.value
                if req.t not in at_step:
                    at_step[req.t] = []
                    heapq.heappush(steps, req.t)
                at_step[req.t].append(v)
                return
            # WaitUntil: no clock here; Gather: every neighbour answers (nothing is missing).
            answer = set() if isinstance(req, Gather) else None

    for v in sorted(programs):
        advance(v, None)
    if on_step is not None:
        on_step(-1, sorted(programs), current)  # the starting values
    while steps:
        t = heapq.heappop(steps)
        nodes = sorted(at_step.pop(t))
        got = {}
        for v in nodes:
            got[v] = {w: requests[w].value for w in partners_at(v, t)}
            for w in got[v]:
                if requests[w].t != t:  # pragma: no cover - a program out of step
                    raise RuntimeError(f"node {w} is not at step {t}")
        for v in nodes:
            advance(v, got[v])
        if on_step is not None:
            on_step(t, nodes, current)
    return outcomes


# --------------------------------------------------------------------------- what a run gives


@dataclass
class SimResult:
    plan: object  # MuffliatoPlan or RandomizedPlan
    inputs: np.ndarray  # (n, D) private values
    finals: np.ndarray  # (n, D) x^T
    history_mse: list[float]  # mean squared error to the true mean after each step (0..T)

    @property
    def true_mean(self) -> np.ndarray:
        return self.inputs.mean(axis=0)


@dataclass
class LearningSimResult:
    plan: object  # LearningPlan
    models: np.ndarray  # (rounds + 1, n, dim): every node's model after each round (central: n=1)
    metrics: list[dict]  # learning round_metrics per round (0..R)
    # decor with keep_correlated: every node's correlated-noise term per round,
    # (rounds, n, dim); None otherwise.
    correlated: np.ndarray | None = None

    @property
    def finals(self) -> np.ndarray:
        return self.models[-1]


@dataclass
class WalkSimResult:
    plan: object  # WalkPlan
    traces: list  # one TokenTrace per token

    @property
    def finals(self) -> np.ndarray:
        """(tokens, dim): every token's final value."""
        return np.stack([t.final for t in self.traces])
