"""Who a re-plan moves, what each move costs, and when it pays (placement/moves.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from weave_slurm.model.cost import MoveCost
from weave_slurm.model.profile import JobProfile, simple_profile
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.group import Group, Member
from weave_slurm.placement.moves import (
    MoveBooks,
    books,
    changed_groups,
    pauses,
    pays,
    relabel,
)

from .conftest import capacity

MOVES = MoveCost(rollout_gbps=400.0, train_gbps=400.0, restart_s=30.0, repin_restart_s=2.0)


def job(job_id: str, rollout_s: float = 100.0, train_s: float = 100.0,
        slo: float = 2.0) -> JobProfile:
    return simple_profile(job_id, rollout_s, train_s, slo, rollout_state_gib=200.0,
                          train_state_gib=100.0)


def group(gid: int, *members: tuple[JobProfile, tuple[int, ...]]) -> Group:
    nodes = 1 + max(p for _, pins in members for p in pins)
    return Group(gid, tuple(Member(j, pins) for j, pins in members), nodes, 1)


def state(*groups: Group) -> ClusterState:
    cap = replace(capacity(max_group_size=4), moves=MOVES)
    return ClusterState(cap, groups, 1 + max((g.group_id for g in groups), default=0))


A, B, C, D = job("a"), job("b"), job("c"), job("d")


def test_relabel_gives_each_proposed_group_the_id_of_the_group_it_keeps_most_of() -> None:
    before = state(group(1, (A, (0,)), (B, (1,))), group(2, (C, (0,)), (D, (1,))))
    # A proposal built from scratch numbers its groups anew: {c, d, a} and {b}.
    proposal = state(group(7, (B, (0,))), group(8, (C, (0,)), (D, (1,)), (A, (0,))))
    after = relabel(before, proposal)
    assert {g.job_ids: g.group_id for g in after.groups} == {("b",): 1, ("c", "d", "a"): 2}
    # b kept group 1's id; a moved to group 2; c and d stayed.
    assert set(pauses(before, after)) == {"a"}
    assert after.next_group_id > max(g.group_id for g in after.groups)


def test_unchanged_groups_keep_their_objects_and_ids() -> None:
    g1, g2 = group(1, (A, (0,))), group(2, (B, (0,)), (C, (1,)))
    before = state(g1, g2)
    proposal = ClusterState(before.capacity, (g1, group(9, (B, (0,)), (C, (0,)))), 10)
    gone, new = changed_groups(before, proposal)
    assert gone == (g2,) and [g.group_id for g in new] == [9]
    after = relabel(before, proposal)
    assert after.by_id[1] is g1 and after.by_id[2].job_ids == ("b", "c")


def test_a_move_is_charged_state_over_the_link_plus_a_restart_a_repin_less() -> None:
    before = state(group(1, (A, (0,)), (B, (1,))), group(2, (C, (0,))))
    # a moves to group 2 (onto c's node); b stays in group 1, c in group 2.
    after = relabel(before, state(group(1, (B, (0,))), group(2, (C, (0,)), (A, (0,)))))
    charged = pauses(before, after)
    assert charged == {"a": pytest.approx(MOVES.move_s(200.0, 100.0))}
    # Inside one group, a and b come to share a node: both are charged a re-pin.
    before = state(group(1, (A, (0,)), (B, (1,)), (C, (2,))))
    after = relabel(before, state(group(1, (A, (0,)), (B, (0,)), (C, (1,)))))
    assert pauses(before, after) == {"a": pytest.approx(MOVES.repin_s(200.0)),
                                     "b": pytest.approx(MOVES.repin_s(200.0))}


def test_arrivals_and_jobs_not_started_are_moved_free() -> None:
    before = state(group(1, (A, (0,))), group(2, (B, (0,))))
    after = relabel(before, state(group(1, (A, (0,)), (B, (0,)), (C, (0,)))))
    assert set(pauses(before, after)) == {"b"}
    assert pauses(before, after, free={"b"}) == {}


def test_work_rate_is_the_busy_time_value_of_every_member() -> None:
    s = state(group(1, (A, (0,)), (B, (0,))))  # period 200 s, one rollout node
    rates = s.capacity.rates
    per_job = (100 * rates.rollout_node_hour + 100 * rates.train_node_hour) / 200.0
    assert s.work_per_hour == pytest.approx(2 * per_job)


def test_a_proposal_pays_only_if_no_dearer_and_cheaper_per_unit_of_work() -> None:
    two = state(group(1, (A, (0,))), group(2, (B, (0,))))
    one = state(group(1, (A, (0,)), (B, (0,))))
    charged = {"b": 35.0}
    merge = books(two, relabel(two, one), charged, horizon_s=3600.0)
    assert merge.cost_after < merge.cost_before and pays(merge)
    # The same merge over a horizon too short to pay back the pause does not pay...
    assert not pays(books(two, relabel(two, one), charged, horizon_s=10.0))
    # ... nor does splitting (dearer per hour) nor a no-op.
    assert not pays(books(one, relabel(one, two), charged, horizon_s=3600.0))
    assert not pays(books(one, relabel(one, one), {}, horizon_s=3600.0))


def test_move_books_efficiency_subtracts_the_paused_work() -> None:
    b = MoveBooks(cost_before=4.0, cost_after=3.0, work_before=2.0, work_after=2.0,
                  lost_work=1.0, horizon_s=7200.0)
    assert b.efficiency_before == 2.0
    assert b.efficiency_after == pytest.approx(3.0 * 2 / (2.0 * 2 - 1.0))
    assert MoveBooks(1.0, 1.0, 1.0, 1.0, 5.0, 3600.0).efficiency_after == float("inf")
