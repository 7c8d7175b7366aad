"""A value with NaN or an infinity from a neighbour is refused by the engine: logged as a
``bad-message`` of kind ``non-finite``, never used. In the step exchange it counts as not
received (a ``refused`` miss); a token hand-off is not acknowledged, so the sender re-routes.
Every other node's estimate stays finite."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from memcases import cfg_of

from coordinator_free.engine.events import Send
from coordinator_free.families import family_of
from coordinator_free.inmemory import run_config

BAD = 1


class Poisoner:
    """An honest node engine whose outgoing values of one kind are replaced by ``poison``
    (NaN, or an infinity) when ``pick(message)`` says so; everything else is untouched."""

    def __init__(self, inner, kind: str, pick, poison: float, limit: int):
        self.inner, self.kind, self.pick, self.poison = inner, kind, pick, poison
        self.limit = limit
        self.sent: list[tuple[int, int, int]] = []  # (peer, round, step) of poisoned messages

    @property
    def finished(self) -> bool:
        return self.inner.finished

    def next_wakeup(self):
        return self.inner.next_wakeup()

    def start(self, now):
        return self._poison(self.inner.start(now))

    def handle(self, event, now):
        return self._poison(self.inner.handle(event, now))

    def _poison(self, actions):
        out = []
        for a in actions:
            m = getattr(a, "message", None)
            if (
                isinstance(a, Send)
                and m.kind == self.kind
                and self.pick(m)
                and len(self.sent) < self.limit
            ):
                bad = np.full_like(m.payload, self.poison)
                bad[0] = m.payload[0]  # one clean entry: the whole vector must be checked
                a = Send(a.peer, dataclasses.replace(m, payload=bad), a.on_sent)
                self.sent.append((a.peer, m.round, m.step))
            out.append(a)
        return out


def poisoned_run(name: str, kind: str, pick, poison: float = float("nan"), limit: int = 99):
    cfg = cfg_of(name)
    family = family_of(cfg.protocol.name)
    made: dict[int, Poisoner] = {}

    def engine_of(cfg, plan, v, streams):
        eng = family.node_engine(cfg, plan, v, streams)
        if v == BAD:
            made[v] = eng = Poisoner(eng, kind, pick, poison, limit)
        return eng

    run = run_config(cfg, seed=3, engine_of=engine_of)
    assert made[BAD].sent, "nothing was poisoned: the test would prove nothing"
    return cfg, run, made[BAD].sent


def refusals(run, v: int) -> list[dict]:
    return [r for r in run.records(v, "bad-message") if r["kind"] == "non-finite"]


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", ["muffliato", "dsgd", "muffliato-gd", "decor"])
def test_a_non_finite_step_value_is_refused_and_counted_as_missed(name, poison):
    step = 2
    cfg, run, sent = poisoned_run(name, "value", lambda m: m.step == step, poison)
    fam = family_of(cfg.protocol.name)
    assert set(run.outcome.values()) == {"finished"}, run.outcome
    receivers = {peer for peer, _, _ in sent}
    for w in receivers:
        (ref,) = refusals(run, w)
        assert ref["peer"] == BAD and ref["at"] == step
        misses = [m for m in run.records(w, "miss") if m["peer"] == BAD and m["step"] == step]
        assert [m["reason"] for m in misses] == ["refused"], misses
        # never logged as received (so never used)
        assert not [r for r in run.records(w, "recv") if r["peer"] == BAD and r["step"] == step]
    for v in run.results:
        if fam.learns(cfg):
            assert np.isfinite(run.models[v]).all(), v
        assert np.isfinite(run.results[v]["estimate"]).all(), v
    assert all(not refusals(run, v) for v in run.results if v not in receivers)


def test_the_engine_does_not_wait_out_the_deadline_for_a_refused_value():
    # A refused value ends the wait for that neighbour: the run takes no deadline longer.
    clean = run_config(cfg_of("muffliato"), seed=3)
    _, bad, _ = poisoned_run("muffliato", "value", lambda m: m.step == 2)
    assert bad.end_time < clean.end_time + 0.5  # the deadline is 1 s


@pytest.mark.parametrize("name, ends", [("ring-sum", {"stuck"}), ("complete-sum", {"completed"})])
def test_a_non_finite_token_is_not_acknowledged_and_the_sender_reroutes(name, ends):
    cfg, run, sent = poisoned_run(name, "token", lambda m: True, limit=1)
    ((to, token, step),) = sent
    (ref,) = refusals(run, to)
    assert ref == {**ref, "peer": BAD, "token": token, "at": step}
    assert not [r for r in run.records(to, "token-seen") if r["step"] == step and r["peer"] == BAD]
    reroutes = [r for r in run.records(BAD, "token-reroute") if r["step"] == step]
    # refused at once (answered nack), not waited out to the deadline
    assert reroutes and reroutes[0]["peer"] == to and reroutes[0]["reason"] == "refused"
    finals, how = [], set()
    for res in run.results.values():
        how |= {e["how"] for e in res["walks"]["ended"].values()}
        finals += list(res["walks"]["finals"].values())
    assert how == ends
    assert finals and np.isfinite(np.array(finals, dtype=float)).all()


@pytest.mark.parametrize("size", [1, 2, 7, 8, 31, 32, 33, 64, 1000])
def test_all_finite_finds_every_non_finite_entry_at_any_size(size):
    """The engine's finiteness check (Python floats up to 32 entries, numpy beyond) finds NaN
    and both infinities wherever they sit, and accepts the largest finite doubles (a check by
    sums or squares would overflow on them)."""
    from coordinator_free.engine.step import all_finite

    rng = np.random.default_rng(size)
    value = rng.normal(size=size) * 1e300
    assert all_finite(value)
    assert all_finite(np.full(size, np.finfo(np.float64).max))
    assert all_finite(np.full(size, -np.finfo(np.float64).max))
    for bad in (np.nan, np.inf, -np.inf):
        for i in sorted({0, size // 2, size - 1}):
            poisoned = value.copy()
            poisoned[i] = bad
            assert not all_finite(poisoned), (bad, i)
            assert not all_finite(poisoned.reshape(1, -1)), (bad, i)
