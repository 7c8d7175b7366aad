"""The verdict's order of problems: the node a fault was aimed at comes first."""

from __future__ import annotations

from coordinator_free import verdict


class Ring:
    """A plan as the verdict reads it: n and neighbours."""

    def __init__(self, n: int) -> None:
        self.n = n

    def neighbours(self, v: int) -> list[int]:
        return sorted({(v - 1) % self.n, (v + 1) % self.n})


def missed(peer: int, steps, reason: str = "deadline") -> list[dict]:
    return [{"peer": peer, "step": s, "reason": reason} for s in steps]


def test_cut_node_missed_at_every_step_is_named_before_a_neighbour_missed_more_often():
    """Node 1 is cut late (its neighbours 0 and 2 miss it at every step from 11 on: 10 misses);
    node 0, waiting for node 1's deadline each step, falls behind, so node 3 misses some of its
    values and node 1 (cut) misses all of them from step 9 on: 12 misses. Both are missed by all
    of their neighbours; the cut node, missed at every step since its first miss, is named first
    although it was missed fewer times."""
    results = {
        0: {"missed": missed(1, range(11, 16))},
        1: {"missed": missed(0, range(9, 16)) + missed(2, range(12, 16))},
        2: {"missed": missed(1, range(11, 16))},
        3: {"missed": missed(0, [9, 11, 13, 14, 15], "peer-down")},
    }
    problems = verdict.problems(Ring(4), results, [], walks=False)
    assert [p["node"] for p in problems] == [1, 0, 2], problems
    assert problems[0]["step"] == 11
    assert (
        "missed by all 2 of its neighbours (0, 2) from step 11 (10 miss(es)"
        in (problems[0]["cause"])
    )
    assert "(12 miss(es); deadline, peer-down)" in problems[1]["cause"]
    # Node 2 was missed by node 1 only: named last, as missed by one node.
    assert "missed by node(s) 1 from step 12" in problems[2]["cause"]


def test_when_both_are_missed_at_every_step_the_node_that_missed_everyone_comes_first():
    """Node 1 is cut at the very end (its neighbours miss it at steps 14 and 15); node 0, which
    waited for it, is missed by node 1 and by node 3 at the same two steps: missed as densely,
    as often, and with a lower id. Node 1 itself missed both of its neighbours, node 0 only
    node 1: node 1 is named first."""
    results = {
        0: {"missed": missed(1, [14, 15])},
        1: {"missed": missed(0, [14, 15]) + missed(2, [14, 15])},
        2: {"missed": missed(1, [14, 15])},
        3: {"missed": missed(0, [14, 15])},
    }
    problems = verdict.problems(Ring(4), results, [], walks=False)
    assert [p["node"] for p in problems][:2] == [1, 0], problems
    assert all("(4 miss(es)" in p["cause"] for p in problems[:2])


def test_share_of_neighbours_comes_before_density():
    """A node missed by all of its neighbours comes before one missed at every step by one."""
    results = {
        0: {"missed": missed(1, range(2, 10))},
        2: {"missed": missed(3, [5])},
        4: {"missed": missed(3, [6])},
    }
    problems = verdict.problems(Ring(6), results, [], walks=False)
    assert [p["node"] for p in problems] == [3, 1], problems


def test_failed_process_and_missing_result_come_first():
    results = {0: None, 1: {"missed": missed(2, [3])}, 2: {}}
    failed = [{"node": 2, "returncode": 1, "error": "boom", "step": 3}]
    problems = verdict.problems(Ring(3), results, failed, walks=False)
    assert [p["node"] for p in problems] == [2, 0, 2]
    assert problems[0]["cause"] == "process failed (exit 1): boom"
    assert problems[1]["cause"] == "finished without a result file"
