"""The gossip accountant's views of any gossip plan, for tests that call it on plans of every
gossip family (the families reach their own views through the registry)."""

from __future__ import annotations

from coordinator_free.accounting import gossip
from coordinator_free.families.averaging import accountant as averaging
from coordinator_free.families.learning import accountant as learning
from coordinator_free.families.learning.protocol import LearningPlan
from coordinator_free.families.randomized import accountant as randomized
from coordinator_free.families.randomized.protocol import RandomizedPlan

private_graph_factors = learning.private_graph_factors
planned_schedule = averaging.planned_schedule


def views_of(plan) -> gossip.Views:
    if isinstance(plan, LearningPlan):
        return learning.VIEWS
    if isinstance(plan, RandomizedPlan):
        return randomized.VIEWS
    return averaging.VIEWS


def plan_factors(plan, method: str, **kw):
    return views_of(plan).plan_factors(plan, method, **kw)


def replay(run_dir, plan) -> gossip.Replay:
    return gossip.replay(run_dir, plan, views_of(plan))


def accounting_note(plan) -> str | None:
    return views_of(plan).note(plan)
